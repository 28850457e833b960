// The benchmark's load on one Durable Streams server (bench/durable.py runs it against pgstreams and
// against the protocol's reference server alike). Prints one JSON object. Writes and catch-up
// reads go through node:http with keep-alive connections; the live readers through fetch. Node's
// fetch cost the client 540 to 690 us of CPU per append, more than either server did to answer
// it, so on two CPUs the load measured its own client as much as the server.
// Usage: node durable_load.mjs '<options as JSON>'
//   bases          base URLs of the server (the streams are spread over them: one per process)
//   prefix         the streams' paths start with it
//   connections    concurrent appenders, each on its own stream, one append in flight each (a
//                  list: the first is also the creates part's)
//   part           the part to run: appends:<connections>, creates, catch_up, paced:<appends/s to
//                  each stream>, long_poll, sse
//   pacedStreams   streams of the token-per-POST part, each with an SSE reader
//   seconds        how long each part runs
//   payload        bytes per append (64)
//   readMegabytes  size of the stream the catch-up readers read whole, again and again
//   readers        concurrent catch-up readers
//   latencyStreams streams with one live reader each, for the latency parts
//   interval       milliseconds between two appends to each of those streams
import http from "node:http"
import { performance } from "node:perf_hooks"
import { events } from "./sse.mjs"

const o = JSON.parse(process.argv[2])
// Each part is announced on stdout as it starts and ends ("mark <part> start|end"), so that the
// caller can read the server's counters (transactions, CPU) around it; the report is the last line.
const mark = (part, phase) => console.log(`mark ${part} ${phase}`)
const streamUrl = (i, name) => `${o.bases[i % o.bases.length]}/v1/stream/${o.prefix}/${name}`

// One connection per request in flight, kept open for the next (none closed while idle: each
// part keeps every one of them busy).
const agent = new http.Agent({ keepAlive: true, maxFreeSockets: Infinity })

// A request and its whole answer; refused unless its status is in `ok`, or when its connection
// is silent for REQUEST_TIMEOUT ms (a server that stopped answering fails the part, not hangs
// it). The response's headers are node's, by lowercase name.
const REQUEST_TIMEOUT = 30000
function request(url, { method = "GET", headers = {}, body } = {}, ok = [200, 201, 204]) {
  return new Promise((resolve, reject) => {
    const data = typeof body === "string" ? Buffer.from(body) : body
    const sent = http.request(url, { method, agent, headers: { ...headers, "Content-Length": data?.length ?? 0 } })
    sent.setTimeout(REQUEST_TIMEOUT, () => sent.destroy(new Error(`${method} ${url}: no answer in ${REQUEST_TIMEOUT} ms`)))
    sent.on("error", reject)
    sent.on("response", (response) => {
      const chunks = []
      response.on("data", (chunk) => chunks.push(chunk))
      response.on("error", reject)
      response.on("end", () => {
        if (ok.includes(response.statusCode)) resolve({ response, body: Buffer.concat(chunks) })
        else reject(new Error(`${method} ${url}: ${response.statusCode}`))
      })
    })
    sent.end(data)
  })
}

const create = (url, type) => request(url, { method: "PUT", headers: { "Content-Type": type } })
// At setup: a server that drops a connection under many at once gets a few more tries.
async function createNow(url, type) {
  for (let attempt = 1; ; attempt++) {
    try {
      return await create(url, type)
    } catch (error) {
      if (attempt >= 5) throw error
      await new Promise((resolve) => setTimeout(resolve, 100 * attempt))
    }
  }
}
const append = (url, type, body) => request(url, { method: "POST", headers: { "Content-Type": type }, body })

// Until `done()` holds (asked every 50 ms) or `limit` ms have passed, whichever comes first.
async function until(done, limit) {
  const end = performance.now() + limit
  while (!done() && performance.now() < end) await new Promise((resolve) => setTimeout(resolve, 50))
}

function percentile(values, p) {
  const sorted = [...values].sort((a, b) => a - b)
  return sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] : null
}

const ms = (values) => ({ p50: percentile(values, 50), p99: percentile(values, 99), max: percentile(values, 100) })

async function appends(connections) {
  const payload = new Uint8Array(o.payload).fill(97)
  const urls = Array.from({ length: connections }, (_, i) => streamUrl(i, `append-${connections}-${i}`))
  await Promise.all(urls.map((url) => createNow(url, "application/octet-stream")))
  const took = []
  let failed = 0
  mark(`appends-${connections}`, "start")
  const started = performance.now()
  const end = started + o.seconds * 1000
  await Promise.all(
    urls.map(async (url) => {
      while (performance.now() < end) {
        const sent = performance.now()
        try {
          await append(url, "application/octet-stream", payload)
          took.push(performance.now() - sent)
        } catch {
          failed++
        }
      }
    })
  )
  const seconds = (performance.now() - started) / 1000
  mark(`appends-${connections}`, "end")
  return { connections, appends_per_second: took.length / seconds, appends: took.length, failed, latency_ms: ms(took) }
}

// PUTs of new streams from `connections[0]` connections, one in flight each.
async function creates() {
  const connections = o.connections[0]
  let done = 0
  let failed = 0
  mark("creates", "start")
  const started = performance.now()
  const end = started + o.seconds * 1000
  await Promise.all(
    Array.from({ length: connections }, async (_, c) => {
      for (let i = 0; performance.now() < end; i++) {
        try {
          await create(streamUrl(c, `create-${c}-${i}`), "application/octet-stream")
          done++
        } catch {
          failed++
        }
      }
    })
  )
  const seconds = (performance.now() - started) / 1000
  mark("creates", "end")
  return { connections, creates_per_second: done / seconds, creates: done, failed }
}

// The token-per-POST shape: `pacedStreams` streams, each appended "<seq>;" `rate` times a
// second (open loop: an append is sent on time whether the last one was answered or not) and
// read by one SSE reader; the time from each append's request to its answer and to its receipt.
async function paced(rate) {
  const n = o.pacedStreams
  const period = 1000 / rate
  const answeredIn = []
  const deliveredIn = []
  let failed = 0
  let missed = 0
  const controllers = []
  const streams = await Promise.all(
    Array.from({ length: n }, async (_, i) => {
      const url = streamUrl(i, `paced-${i}`)
      const { response } = await createNow(url, "text/plain")
      const got = new Map()
      const received = (text, at) => {
        for (const seq of text.split(";").filter(Boolean)) if (!got.has(seq)) got.set(seq, at)
      }
      const controller = new AbortController()
      controllers.push(controller)
      const reader = sseReader(url, response.headers["stream-next-offset"], received, controller.signal)
      return { url, got, reader, sent: [] }
    })
  )
  // The readers' time to connect: a tenth of the part, 1 s at most (1 s for a part of 10 s or more).
  await new Promise((resolve) => setTimeout(resolve, Math.min(1000, o.seconds * 100)))
  mark(`paced-${rate}`, "start")
  const started = performance.now()
  const end = started + o.seconds * 1000
  await Promise.all(
    streams.map(async (stream, i) => {
      const pending = []
      let next = started + (i / n) * period // spread the streams over the period
      for (let seq = 0; next < end; seq++, next += period) {
        const wait = next - performance.now()
        if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait))
        const sent = performance.now()
        stream.sent.push(sent)
        pending.push(
          append(stream.url, "text/plain", `${seq};`).then(
            () => answeredIn.push(performance.now() - sent),
            () => failed++
          )
        )
      }
      await Promise.all(pending)
    })
  )
  const seconds = (performance.now() - started) / 1000
  mark(`paced-${rate}`, "end")
  // Every append's receipt, for 2 s at most (`got` holds only the seqs sent).
  await until(() => streams.every((stream) => stream.got.size >= stream.sent.length), 2000)
  for (const stream of streams) {
    stream.sent.forEach((sent, seq) => {
      const at = stream.got.get(String(seq))
      if (at === undefined) missed++
      else deliveredIn.push(at - sent)
    })
  }
  for (const controller of controllers) controller.abort()
  await Promise.all(streams.map((stream) => stream.reader.catch(() => {})))
  const offered = n * rate
  return {
    streams: n,
    rate,
    offered_per_second: offered,
    appends_per_second: answeredIn.length / seconds,
    failed,
    missed,
    answered_ms: ms(answeredIn),
    delivered_ms: ms(deliveredIn),
  }
}

async function readWhole(url) {
  let offset = "-1"
  let bytes = 0
  for (let i = 0; i < 100000; i++) {
    const { response, body } = await request(`${url}?offset=${encodeURIComponent(offset)}`)
    bytes += body.length
    offset = response.headers["stream-next-offset"]
    if (response.headers["stream-up-to-date"] === "true") return bytes
  }
  throw new Error(`${url}: no end after 100000 reads`)
}

async function catchUp() {
  const url = streamUrl(0, "catch-up")
  await create(url, "application/octet-stream")
  const piece = new Uint8Array(65536).map((_, i) => i % 251)
  const pieces = Math.ceil((o.readMegabytes * 1e6) / piece.length)
  for (let i = 0; i < pieces; i++) await append(url, "application/octet-stream", piece)  // must all succeed
  const expected = pieces * piece.length
  let bytes = 0
  let reads = 0
  let failed = 0
  mark("catch-up", "start")
  const started = performance.now()
  const end = started + o.seconds * 1000
  await Promise.all(
    Array.from({ length: o.readers }, async () => {
      while (performance.now() < end) {
        let got
        try {
          got = await readWhole(url)
        } catch {
          failed++
          continue
        }
        if (got !== expected) throw new Error(`read ${got} bytes of ${expected}`)
        bytes += got
        reads++
      }
    })
  )
  const seconds = (performance.now() - started) / 1000
  mark("catch-up", "end")
  return { megabytes_per_second: bytes / 1e6 / seconds, whole_reads: reads, failed, stream_megabytes: expected / 1e6 }
}

// One live reader per stream and one writer appending "<seq>;" every `interval` ms: for each
// append, the time from the writer's request and from its response to the reader's receipt (the
// second is negative when the reader had it first).
async function latency(live) {
  const fromRequest = []
  const fromResponse = []
  let missed = 0
  const end = performance.now() + o.seconds * 1000
  const streams = [] // each stream's appends sent and received, and whether it is done sending
  const delivered = () => streams.every((stream) => stream.done && stream.got.size >= stream.sent.length)
  mark(live, "start")
  await Promise.all(
    Array.from({ length: o.latencyStreams }, async (_, i) => {
      const url = streamUrl(i, `${live}-${i}`)
      const controller = new AbortController()
      const stream = { sent: [], got: new Map(), done: false }
      streams.push(stream)
      const { response } = await create(url, "text/plain")
      const { sent, got } = stream
      const answered = []
      const received = (text, at) => {
        for (const seq of text.split(";").filter(Boolean)) if (!got.has(seq)) got.set(seq, at)
      }
      const tail = response.headers["stream-next-offset"]
      const reader = (live === "sse" ? sseReader : longPollReader)(url, tail, received, controller.signal)
      await new Promise((resolve) => setTimeout(resolve, 200))
      for (let seq = 0; performance.now() < end; seq++) {
        sent.push(performance.now())
        await append(url, "text/plain", `${seq};`)
        answered.push(performance.now())
        await new Promise((resolve) => setTimeout(resolve, o.interval))
      }
      stream.done = true
      // Every stream's every append received (no reader leaves before), for 1 s at most (`got`
      // holds only the seqs sent).
      await until(delivered, 1000)
      for (let seq = 0; seq < sent.length; seq++) {
        const at = got.get(String(seq))
        if (at === undefined) missed++
        else {
          fromRequest.push(at - sent[seq])
          fromResponse.push(at - answered[seq])
        }
      }
      controller.abort()
      await reader.catch(() => {})
    })
  )
  mark(live, "end")
  return { deliveries: fromRequest.length, missed, from_request_ms: ms(fromRequest), from_response_ms: ms(fromResponse) }
}

// A reader goes on after a failed request (the server closed the connection, say) from the
// offset it had, until it is aborted; what it missed shows as missed deliveries.
const pause = () => new Promise((resolve) => setTimeout(resolve, 50))

async function longPollReader(url, offset, received, signal) {
  while (!signal.aborted) {
    try {
      const response = await fetch(`${url}?offset=${encodeURIComponent(offset)}&live=long-poll`, { signal })
      const text = await response.text()
      const at = performance.now()
      if (response.status === 200 && text) received(text, at)
      offset = response.headers.get("Stream-Next-Offset") ?? offset
    } catch {
      if (!signal.aborted) await pause()
    }
  }
}

async function sseReader(url, offset, received, signal) {
  while (!signal.aborted) {
    try {
      offset = await sseResponse(url, offset, received, signal)
    } catch {
      if (!signal.aborted) await pause()
    }
  }
}

// One SSE response read to its end; the offset its last control event gave.
async function sseResponse(url, offset, received, signal) {
  const response = await fetch(`${url}?offset=${encodeURIComponent(offset)}&live=sse`, { signal })
  for await (const [event, data] of events(response)) {
    if (event === "data") received(data, performance.now())
    else if (event === "control") offset = JSON.parse(data).streamNextOffset
  }
  if (response.status !== 200) await pause()
  return offset
}

// One part per run (`part`), so that the caller can start each on a fresh server.
const report = {}
if (o.part.startsWith("appends:")) report.appends = [await appends(Number(o.part.slice("appends:".length)))]
else if (o.part === "creates") report.creates = await creates()
else if (o.part === "catch_up") report.catch_up = await catchUp()
else if (o.part.startsWith("paced:")) report.paced = await paced(Number(o.part.slice("paced:".length)))
else if (o.part === "long_poll") report.long_poll = await latency("long-poll")
else if (o.part === "sse") report.sse = await latency("sse")
else throw new Error(`no part ${o.part}`)
console.log(JSON.stringify(report))
