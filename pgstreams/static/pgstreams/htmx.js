// pgstreams with htmx's SSE extension, for the elements {% stream_html %} renders. Load it after htmx.
//
// It keeps each element's sse-connect (or data-sse-connect) URL at the offset after the last chunk
// swapped in. The browser resumes a dropped response by itself with Last-Event-ID; when it gives up
// (an error status, say from a proxy while the server restarts) the extension opens a new
// EventSource from that attribute, which then resumes there instead of repeating the chunks since
// the page loaded.
//
// And it closes the EventSource on an error the server sent (the stream deleted, or its next
// chunks pruned): the extension would leave it open, and the browser would ask again every second
// for the same answer.
const pgstreamsElement = (event) => event.target.closest("[data-pgstreams-stream]")

document.addEventListener("htmx:sseMessage", (event) => {
  const element = pgstreamsElement(event)
  const offset = event.detail.lastEventId
  if (!element || !/^[0-9]+$/.test(offset)) return
  const name = element.hasAttribute("sse-connect") ? "sse-connect" : "data-sse-connect"
  if (!element.hasAttribute(name)) return
  const url = new URL(element.getAttribute(name), document.baseURI)
  url.searchParams.set("from", String(BigInt(offset) + 1n))
  element.setAttribute(name, url.pathname + url.search)
})

document.addEventListener("htmx:sseError", (event) => {
  // A MessageEvent is an "error" event the server sent; a connection's failure is a plain Event.
  if (pgstreamsElement(event) && event.detail.error instanceof MessageEvent) event.detail.source.close()
})
