// pgstreams with htmx's SSE support, for the elements {% stream_html %} renders: htmx 4's hx-sse
// extension ({% stream_html stream htmx=4 %}) or htmx 2's htmx-ext-sse. Load it after htmx and the
// extension; it listens to both majors' events, so one file serves either.
//
// It keeps each element's URL (hx-sse:connect, or sse-connect with htmx 2; or either with data-)
// at the offset after the last chunk swapped in, so that a connection opened anew from the
// attribute resumes there instead of repeating the chunks since the page loaded. htmx 2's
// extension does that when the browser gives up reconnecting (an error status, say from a proxy
// while the server restarts); htmx 4's when the element is processed again. Otherwise both resume
// a dropped response by themselves with Last-Event-ID (htmx 4 on the URL it first fetched).
//
// And it ends the reading on an error the server sent (the stream deleted, or its next chunks
// pruned): either extension would reconnect, and the server would answer the same again, every
// second with htmx 2, with a growing delay for ever with htmx 4.
const pgstreamsElement = (event) => event.target.closest("[data-pgstreams-stream]")

function pgstreamsFollowFrom(element, names, lastEventId) {
  if (!/^[0-9]+$/.test(lastEventId)) return
  const name = names.find((n) => element.hasAttribute(n))
  if (!name) return
  const url = new URL(element.getAttribute(name), document.baseURI)
  url.searchParams.set("from", String(BigInt(lastEventId) + 1n))
  element.setAttribute(name, url.pathname + url.search)
}

// htmx 2 (htmx-ext-sse): an EventSource per element.
document.addEventListener("htmx:sseMessage", (event) => {
  const element = pgstreamsElement(event)
  if (element) pgstreamsFollowFrom(element, ["sse-connect", "data-sse-connect"], event.detail.lastEventId)
})

document.addEventListener("htmx:sseError", (event) => {
  // A MessageEvent is an "error" event the server sent; a connection's failure is a plain Event.
  if (pgstreamsElement(event) && event.detail.error instanceof MessageEvent) event.detail.source.close()
})

// htmx 4 (hx-sse): a fetch per element, refetched with Last-Event-ID after each response ends.
// after:message comes once the message is swapped in, or dispatched if it is a named event.
document.addEventListener("htmx:sse:after:message", (event) => {
  const element = pgstreamsElement(event)
  if (!element) return
  const { connection, message } = event.detail
  if (message.event === "error") connection.pgstreamsFailed = true // an error the server sent: no reconnection
  pgstreamsFollowFrom(element, ["hx-sse:connect", "data-hx-sse:connect"], message.id)
})

document.addEventListener("htmx:sse:before:connection", (event) => {
  if (pgstreamsElement(event) && event.detail.connection.pgstreamsFailed) event.preventDefault()
})

// htmx 4 swaps the body of an answer that is no event stream (which hx-sse leaves to it), an
// error's too: a 404 for a stream deleted before the page connected, a proxy's error page. The
// element holds the stream's text and nothing else; listen for htmx:response:error to show it.
document.addEventListener("htmx:before:swap", (event) => {
  const type = event.detail.ctx.response?.headers?.get("Content-Type") ?? ""
  if (pgstreamsElement(event) === event.target && !type.includes("text/event-stream")) event.preventDefault()
})
