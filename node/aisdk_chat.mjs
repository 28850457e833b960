// The AI SDK's own chat client (`Chat` from @ai-sdk/react, the class useChat drives) against a
// Django project's AI SDK endpoints, for tests/test_aisdk.py, on either maintained major ("sdk":
// 7, the default, or 6) and with any of its transports: DefaultChatTransport (the answer as a UI
// message stream from pgstreams.aisdk), @durable-streams/aisdk-transport (the answer read from
// the Durable Streams endpoint) or, on ai 7, WebSocketChatTransport (one socket, served by
// pgstreams.aisdk_ws, opened with the `ws` package as a browser would: the session's cookie and
// the site's Origin on its handshake).
//
//   node aisdk_chat.mjs '{"base": "http://127.0.0.1:PORT", "cookie": "...", "csrf": "...",
//                         "chat": "ID", "action": "send" | "resume", "prompt": "...",
//                         "messages": [...], "disconnectAfter": N, "stopAfter": N, "abortAfter": N,
//                         "api": "/ai/chat", "socket": "/ws/ai/chat/", "sdk": 7 | 6,
//                         "transport": "default" | "durable" | "websocket"}'
//
// "send" sends the prompt as a user message; "resume" makes a new Chat with `messages` (as a page
// that reloads renders them) and calls resumeStream(), as useChat({ resume: true }) does on mount.
// Once the chat's answer shows N characters of text, disconnectAfter closes the connection (over
// HTTP, chat.stop(): with resume on, a disconnect; over the socket, the transport's close()),
// stopAfter POSTs the stop endpoint (`${api}/${chat}/stop`, as the demo and the README's example
// have it) and abortAfter calls chat.stop() (over the socket, an abort frame). By the chat's
// message, not by the deltas counted as they arrive: one read can bring many, and a stop then
// would abort them before the chat had shown any. Prints one JSON line: the chat's status, error,
// messages, the text deltas received, the stop endpoint's answer and the SDK's versions.
import { createRequire } from "node:module"
import { createDurableChatTransport } from "@durable-streams/aisdk-transport"
import WebSocket from "ws"

const options = JSON.parse(process.argv[2])
const sdk = options.sdk ?? 7
const { Chat } = await import(sdk === 7 ? "@ai-sdk/react" : "@ai-sdk/react-6")
const ai = await import(sdk === 7 ? "ai" : "ai-6")
const versions = Object.fromEntries(
  [sdk === 7 ? "ai" : "ai-6", sdk === 7 ? "@ai-sdk/react" : "@ai-sdk/react-6"].map((name) => [
    name,
    createRequire(import.meta.url)(`${name}/package.json`).version,
  ]),
)
const headers = { "X-CSRFToken": options.csrf }
const api = `${options.base}${options.api ?? "/ai/chat"}`
let deltas = 0

// What a browser's fetch does here, and a count: the session's cookies go with every request to
// the site (the Durable Streams client reads without the transport's headers), and the text
// deltas of every response are counted as the client reads them, changing nothing.
const nodeFetch = globalThis.fetch
globalThis.fetch = async (url, init = {}) => {
  const sent = new Headers(init.headers)
  if (String(url).startsWith(options.base)) sent.set("Cookie", options.cookie)
  const response = await nodeFetch(url, { ...init, headers: sent })
  if (!response.body) return response
  const decoder = new TextDecoder()
  const counted = response.body.pipeThrough(
    new TransformStream({
      transform(chunk, controller) {
        const found = decoder.decode(chunk, { stream: true }).match(/"type":"text-delta"/g)
        controller.enqueue(chunk)
        if (found) deltas += found.length
      },
    }),
  )
  return new Response(counted, { status: response.status, statusText: response.statusText, headers: response.headers })
}

// A browser's WebSocket: the session's cookie and the page's Origin go with the handshake; the
// frames it carries are counted as the fetches' bodies are.
class BrowserWebSocket extends WebSocket {
  constructor(url, protocols) {
    super(url, protocols, { headers: { Cookie: options.cookie, Origin: options.base } })
    this.on("message", (data) => {
      if (String(data).includes('"type":"text-delta"')) deltas += 1
    })
  }
}

function makeTransport() {
  if (options.transport === "durable") return createDurableChatTransport({ api, headers })
  if (options.transport !== "websocket") return new ai.DefaultChatTransport({ api, headers })
  if (!ai.WebSocketChatTransport) throw new Error(`ai ${sdk} has no WebSocketChatTransport`)
  const url = `${options.base.replace(/^http/, "ws")}${options.socket ?? "/ws/ai/chat/"}`
  return new ai.WebSocketChatTransport({ url, webSocket: BrowserWebSocket })
}
const transport = makeTransport()
const chat = new Chat({ id: options.chat, messages: options.messages ?? [], transport })

const after = options.disconnectAfter ?? options.stopAfter ?? options.abortAfter
const shown = () => {
  const last = chat.messages.at(-1)
  return last?.role === "assistant" ? last.parts.map((p) => (p.type === "text" ? p.text : "")).join("") : ""
}
let stopped = null
const watching =
  after == null
    ? null
    : setInterval(() => {
        if (shown().length < after) return
        clearInterval(watching)
        if (options.stopAfter != null) {
          stopped = fetch(`${api}/${options.chat}/stop`, { method: "POST", headers }).then((r) => r.json())
        } else if (options.disconnectAfter != null && options.transport === "websocket") {
          stopped = Promise.resolve(transport.close())
        } else {
          stopped = Promise.resolve(chat.stop())
        }
      }, 5)

const deadline = setTimeout(() => {
  console.log(JSON.stringify({ timedOut: true, status: chat.status, deltas, messages: chat.messages }))
  process.exit(2)
}, 60_000)

if (options.action === "send") {
  await chat.sendMessage({ text: options.prompt })
} else {
  await chat.resumeStream()
}
const stop = stopped ? await stopped : null
clearTimeout(deadline)
clearInterval(watching)
console.log(
  JSON.stringify({ status: chat.status, error: chat.error?.message ?? null, deltas, stop, versions, messages: chat.messages }),
)
process.exit(0) // a read the client let go of may still hold its connection (the Durable Streams one does)
