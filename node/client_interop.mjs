// The official TypeScript client (@durable-streams/client) reading a stream that Python wrote
// with pgstreams.write(), for tests/test_durable.py. Prints one JSON line per step:
//   catch-up  everything from the start, without waiting
//   resume    everything from the offset given as the third argument
//   tailing   it now follows the stream live (the test then writes more and closes it)
//   live      what it received live, once the stream said it is closed
// Usage: node client_interop.mjs <stream url> <long-poll|sse> <offset>
import { stream } from "@durable-streams/client"

const [url, live, resumeAt] = process.argv.slice(2)
const say = (step, fields) => console.log(JSON.stringify({ step, ...fields }))

const all = await stream({ url, offset: "-1", live: false })
say("catch-up", { text: await all.text(), offset: all.offset, upToDate: all.upToDate })

const resumed = await stream({ url, offset: resumeAt, live: false })
say("resume", { text: await resumed.text() })

const tail = await stream({ url, offset: all.offset, live })
let received = ""
await new Promise((resolve, reject) => {
  tail.subscribeText((chunk) => {
    received += chunk.text
    if (chunk.streamClosed) resolve()
  })
  tail.closed.then(resolve, reject)
  say("tailing", {})
})
say("live", { text: received, closed: tail.streamClosed, offset: tail.offset })
