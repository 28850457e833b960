// The AI SDK's own chat client (`Chat` from @ai-sdk/react, the class useChat drives) against a
// Django project's AI SDK endpoints, for tests/test_aisdk.py, with either transport:
// DefaultChatTransport (the answer as a UI message stream from pgstreams.aisdk) or
// @durable-streams/aisdk-transport (the answer read from the Durable Streams endpoint).
//
//   node aisdk_chat.mjs '{"base": "http://127.0.0.1:PORT", "cookie": "...", "csrf": "...",
//                         "chat": "ID", "action": "send" | "resume", "prompt": "...",
//                         "messages": [...], "disconnectAfter": N, "stopAfter": N,
//                         "api": "/ai/chat", "transport": "default" | "durable"}'
//
// "send" sends the prompt as a user message; "resume" makes a new Chat with `messages` (as a page
// that reloads renders them) and calls resumeStream(), as useChat({ resume: true }) does on mount.
// Once the chat's answer shows N characters of text, disconnectAfter calls chat.stop() (with resume
// on, a disconnect), and stopAfter POSTs the stop endpoint (`${api}/${chat}/stop`, as the demo and
// the README's example have it). By the chat's message, not by the deltas counted as they arrive:
// one read can bring many, and a stop then would abort them before the chat had shown any. Prints one JSON line: the chat's status, error, messages, the text
// deltas received, and the stop endpoint's answer.
import { Chat } from "@ai-sdk/react"
import { createDurableChatTransport } from "@durable-streams/aisdk-transport"
import { DefaultChatTransport } from "ai"

const options = JSON.parse(process.argv[2])
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

const transport =
  options.transport === "durable"
    ? createDurableChatTransport({ api, headers })
    : new DefaultChatTransport({ api, headers })
const chat = new Chat({ id: options.chat, messages: options.messages ?? [], transport })

const after = options.disconnectAfter ?? options.stopAfter
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
        stopped =
          options.disconnectAfter != null
            ? Promise.resolve(chat.stop())
            : fetch(`${api}/${options.chat}/stop`, { method: "POST", headers }).then((r) => r.json())
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
  JSON.stringify({ status: chat.status, error: chat.error?.message ?? null, deltas, stop, messages: chat.messages }),
)
process.exit(0) // a read the client let go of may still hold its connection (the Durable Streams one does)
