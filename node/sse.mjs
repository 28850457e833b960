// Server-Sent Events of a fetch response, for the benchmark's load generators: [event, data]
// pairs, the event "message" unless named, the data lines joined with newlines.
export async function* events(response) {
  const decoder = new TextDecoder()
  let buffer = ""
  for await (const part of response.body) {
    buffer += decoder.decode(part, { stream: true })
    let end
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end)
      buffer = buffer.slice(end + 2)
      let event = "message"
      const data = []
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim()
        else if (line.startsWith("data:")) data.push(line.slice(line.startsWith("data: ") ? 6 : 5))
      }
      if (data.length) yield [event, data.join("\n")]
    }
  }
}
