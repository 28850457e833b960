// The AI SDK's own chat client (`Chat` from @ai-sdk/react, the class useChat drives, with its
// DefaultChatTransport) against the demo's AI SDK endpoints, for tests/test_aisdk.py.
//
//   node aisdk_chat.mjs '{"base": "http://127.0.0.1:PORT", "cookie": "...", "csrf": "...",
//                         "chat": "ID", "action": "send" | "resume", "prompt": "...",
//                         "messages": [...], "disconnectAfter": N, "stopAfter": N, "api": "/ai/chat"}'
//
// "send" sends the prompt as a user message; "resume" makes a new Chat with `messages` (as a page
// that reloads renders them) and calls resumeStream(), as useChat({ resume: true }) does on mount.
// After N text deltas have arrived, disconnectAfter calls chat.stop() (with resume on, a
// disconnect), and stopAfter POSTs the stop endpoint (`${api}/${chat}/stop`, as the demo and the
// README's example have it). Prints one JSON line: the chat's
// status, error, messages, and the deltas received.
import { Chat } from "@ai-sdk/react"
import { DefaultChatTransport } from "ai"

const options = JSON.parse(process.argv[2])
const headers = { Cookie: options.cookie, "X-CSRFToken": options.csrf }
const api = `${options.base}${options.api ?? "/ai/chat"}`
let deltas = 0
let onDelta = () => {}

// Counts the text deltas of every response as the transport reads it; changes nothing.
async function countingFetch(url, init) {
  const response = await fetch(url, init)
  if (!response.body) return response
  const decoder = new TextDecoder()
  const counted = response.body.pipeThrough(
    new TransformStream({
      transform(chunk, controller) {
        const text = decoder.decode(chunk, { stream: true })
        const found = text.match(/"type":"text-delta"/g)
        controller.enqueue(chunk)
        if (found) {
          deltas += found.length
          onDelta()
        }
      },
    }),
  )
  return new Response(counted, { status: response.status, statusText: response.statusText, headers: response.headers })
}

const chat = new Chat({
  id: options.chat,
  messages: options.messages ?? [],
  transport: new DefaultChatTransport({ api, headers, fetch: countingFetch }),
})

const after = options.disconnectAfter ?? options.stopAfter
let stopped = null
if (after != null) {
  onDelta = () => {
    if (deltas < after || stopped) return
    stopped = options.disconnectAfter != null
      ? Promise.resolve(chat.stop())
      : fetch(`${api}/${options.chat}/stop`, { method: "POST", headers }).then((r) => r.json())
  }
}

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
console.log(
  JSON.stringify({ status: chat.status, error: chat.error?.message ?? null, deltas, stop, messages: chat.messages }),
)
