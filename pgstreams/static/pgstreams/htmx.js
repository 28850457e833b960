// pgstreams with htmx's SSE extension: keeps the sse-connect URL of each element that
// {% stream_html %} renders at the offset after the last chunk it swapped in. The browser resumes
// a dropped response by itself with Last-Event-ID; when it gives up (an error status, say from a
// proxy while the server restarts) the extension opens a new EventSource from sse-connect, which
// then resumes there instead of repeating the chunks since the page loaded. Load it after htmx.
document.addEventListener("htmx:sseMessage", (event) => {
  const element = event.target.closest("[data-pgstreams-stream][sse-connect]")
  const offset = event.detail.lastEventId
  if (!element || !/^[0-9]+$/.test(offset)) return
  const url = new URL(element.getAttribute("sse-connect"), document.baseURI)
  url.searchParams.set("from", String(BigInt(offset) + 1n))
  element.setAttribute("sse-connect", url.pathname + url.search)
})
