// The demo's AI SDK chat page (demo_project/chat/templates/chat/ai.html): the SDK's own useChat,
// resuming on load, over the transport the page names: "websocket", ai 7's WebSocketChatTransport
// on the demo's chat socket (ws/ai/chat/, pgstreams.aisdk_ws), or "http", DefaultChatTransport on
// the demo's ai/chat endpoints. Bundled with React into the demo's static files by
// vendor_aisdk.mjs, once with ai 7 and once with ai 6 (which has no WebSocket transport):
// cd node && npm ci && npm run vendor-aisdk
import { useChat } from "@ai-sdk/react"
import { DefaultChatTransport, readUIMessageStream } from "ai"
import { useMemo, useState } from "react"
import { createRoot } from "react-dom/client"
import { WebSocketChatTransport } from "websocket-transport" // ai 7's, or undefined (vendor_aisdk.mjs)

const root = document.getElementById("ai-chat")
const { chatId, csrf, api, socket, transport: kind } = root.dataset
const headers = { "X-CSRFToken": csrf }

// The earlier turns as the page rendered them: prompts, and each answer's stored parts, made
// into messages by the SDK itself. The latest answer is not among them: useChat resumes it.
async function earlierMessages() {
  const turns = JSON.parse(document.getElementById("ai-history").textContent)
  const messages = []
  for (const turn of turns) {
    if (turn.role === "user") {
      messages.push(turn)
      continue
    }
    let message
    const stream = new ReadableStream({
      start(controller) {
        turn.parts.forEach((part) => controller.enqueue(part))
        controller.close()
      },
    })
    for await (message of readUIMessageStream({ stream })) {
      // the last snapshot is the whole message
    }
    if (message) messages.push(message)
  }
  return messages
}

function Text({ message }) {
  return message.parts.filter((part) => part.type === "text").map((part) => part.text).join("")
}

// One socket for the page's chat, opened at the first request; the session's cookie goes with
// its handshake, so the frames need no headers.
function makeTransport() {
  return kind === "websocket" ? new WebSocketChatTransport({ url: socket }) : new DefaultChatTransport({ api, headers })
}

function Chat({ initialMessages }) {
  const transport = useMemo(makeTransport, [])
  const { messages, sendMessage, status, error, stop: stopStreaming } = useChat({
    id: chatId,
    messages: initialMessages,
    resume: true,
    transport,
  })
  const [prompt, setPrompt] = useState("")
  const busy = status === "submitted" || status === "streaming"
  const send = (event) => {
    event.preventDefault()
    if (!prompt.trim() || busy) return
    sendMessage({ text: prompt })
    setPrompt("")
  }
  // Over the socket, stop() sends an abort frame, which ends the answer for every reader. Over
  // HTTP it only disconnects (the answer would go on, and come back at the next load): the
  // demo's endpoint ends the answer, and the client reads its abort part.
  const stop = () => (kind === "websocket" ? stopStreaming() : fetch(`${api}/${chatId}/stop`, { method: "POST", headers }))
  return (
    <>
      <ol className="messages">
        {messages.map((message) => (
          <li key={message.id} className={message.role} data-role={message.role}>
            <Text message={message} />
          </li>
        ))}
      </ol>
      <p className="status" id="ai-status" data-state={error ? "error" : status}>
        {error ? `the answer ended with an error: ${error.message}` : status}
      </p>
      <form className="ask" onSubmit={send}>
        <label htmlFor="ai-prompt">Ask the (fake) model</label>
        <textarea id="ai-prompt" rows="2" maxLength="2000" value={prompt} onChange={(e) => setPrompt(e.target.value)} />
        <button type="submit" id="ai-send" disabled={busy}>Send</button>
        <button type="button" id="ai-stop" hidden={!busy} onClick={stop}>Stop</button>
      </form>
    </>
  )
}

createRoot(root).render(<Chat initialMessages={await earlierMessages()} />)
