// The benchmark's load on one Durable Streams server (bench/durable.py runs it against pgstreams and
// against the protocol's reference server alike), with Node's own fetch. Prints one JSON object.
// Usage: node durable_load.mjs '<options as JSON>'
//   bases          base URLs of the server (the streams are spread over them: one per process)
//   prefix         the streams' paths start with it
//   connections    concurrent appenders, each on its own stream (64)
//   seconds        how long each part runs
//   payload        bytes per append (64)
//   readMegabytes  size of the stream the catch-up readers read whole, again and again
//   readers        concurrent catch-up readers
//   latencyStreams streams with one live reader each, for the latency parts
//   interval       milliseconds between two appends to each of those streams
import { performance } from "node:perf_hooks"

const o = JSON.parse(process.argv[2])
const streamUrl = (i, name) => `${o.bases[i % o.bases.length]}/v1/stream/${o.prefix}/${name}`

async function request(url, init, ok = [200, 201, 204]) {
  const response = await fetch(url, init)
  const body = new Uint8Array(await response.arrayBuffer())
  if (!ok.includes(response.status)) throw new Error(`${init?.method ?? "GET"} ${url}: ${response.status}`)
  return { response, body }
}

const create = (url, type) => request(url, { method: "PUT", headers: { "Content-Type": type } })
const append = (url, type, body) => request(url, { method: "POST", headers: { "Content-Type": type }, body })

function percentile(values, p) {
  const sorted = [...values].sort((a, b) => a - b)
  return sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] : null
}

async function appends() {
  const payload = new Uint8Array(o.payload).fill(97)
  const urls = Array.from({ length: o.connections }, (_, i) => streamUrl(i, `append-${i}`))
  await Promise.all(urls.map((url) => create(url, "application/octet-stream")))
  let done = 0
  const started = performance.now()
  const end = started + o.seconds * 1000
  await Promise.all(
    urls.map(async (url) => {
      while (performance.now() < end) {
        await append(url, "application/octet-stream", payload)
        done++
      }
    })
  )
  return { appends_per_second: done / ((performance.now() - started) / 1000), appends: done }
}

async function readWhole(url) {
  let offset = "-1"
  let bytes = 0
  for (let i = 0; i < 100000; i++) {
    const { response, body } = await request(`${url}?offset=${encodeURIComponent(offset)}`)
    bytes += body.length
    offset = response.headers.get("Stream-Next-Offset")
    if (response.headers.get("Stream-Up-To-Date") === "true") return bytes
  }
  throw new Error(`${url}: no end after 100000 reads`)
}

async function catchUp() {
  const url = streamUrl(0, "catch-up")
  await create(url, "application/octet-stream")
  const piece = new Uint8Array(65536).map((_, i) => i % 251)
  const pieces = Math.ceil((o.readMegabytes * 1e6) / piece.length)
  for (let i = 0; i < pieces; i++) await append(url, "application/octet-stream", piece)
  const expected = pieces * piece.length
  let bytes = 0
  let reads = 0
  const started = performance.now()
  const end = started + o.seconds * 1000
  await Promise.all(
    Array.from({ length: o.readers }, async () => {
      while (performance.now() < end) {
        const got = await readWhole(url)
        if (got !== expected) throw new Error(`read ${got} bytes of ${expected}`)
        bytes += got
        reads++
      }
    })
  )
  const seconds = (performance.now() - started) / 1000
  return { megabytes_per_second: bytes / 1e6 / seconds, whole_reads: reads, stream_megabytes: expected / 1e6 }
}

// One live reader per stream and one writer appending "<seq>;" every `interval` ms: for each
// append, the time from the writer's request and from its response to the reader's receipt (the
// second is negative when the reader had it first).
async function latency(live) {
  const fromRequest = []
  const fromResponse = []
  let missed = 0
  const end = performance.now() + o.seconds * 1000
  await Promise.all(
    Array.from({ length: o.latencyStreams }, async (_, i) => {
      const url = streamUrl(i, `${live}-${i}`)
      const controller = new AbortController()
      const { response } = await create(url, "text/plain")
      const sent = []
      const answered = []
      const got = new Map()
      const received = (text, at) => {
        for (const seq of text.split(";").filter(Boolean)) if (!got.has(seq)) got.set(seq, at)
      }
      const tail = response.headers.get("Stream-Next-Offset")
      const reader = (live === "sse" ? sseReader : longPollReader)(url, tail, received, controller.signal)
      await new Promise((resolve) => setTimeout(resolve, 200))
      for (let seq = 0; performance.now() < end; seq++) {
        sent.push(performance.now())
        await append(url, "text/plain", `${seq};`)
        answered.push(performance.now())
        await new Promise((resolve) => setTimeout(resolve, o.interval))
      }
      await new Promise((resolve) => setTimeout(resolve, 1000))
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
  const ms = (values) => ({ p50: percentile(values, 50), p99: percentile(values, 99), max: percentile(values, 100) })
  return { deliveries: fromRequest.length, missed, from_request_ms: ms(fromRequest), from_response_ms: ms(fromResponse) }
}

async function longPollReader(url, offset, received, signal) {
  while (!signal.aborted) {
    const response = await fetch(`${url}?offset=${encodeURIComponent(offset)}&live=long-poll`, { signal })
    const text = await response.text()
    const at = performance.now()
    if (response.status === 200 && text) received(text, at)
    offset = response.headers.get("Stream-Next-Offset") ?? offset
  }
}

async function sseReader(url, offset, received, signal) {
  while (!signal.aborted) {
    const response = await fetch(`${url}?offset=${encodeURIComponent(offset)}&live=sse`, { signal })
    const decoder = new TextDecoder()
    let buffer = ""
    for await (const part of response.body) {
      buffer += decoder.decode(part, { stream: true })
      let cut
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut)
        buffer = buffer.slice(cut + 2)
        const lines = event.split("\n")
        const data = lines.filter((l) => l.startsWith("data:")).map((l) => l.slice(5)).join("\n")
        if (lines.includes("event: data")) received(data, performance.now())
        else if (lines.includes("event: control")) offset = JSON.parse(data).streamNextOffset
      }
    }
  }
}

const report = { appends: await appends(), catch_up: await catchUp() }
report.long_poll = await latency("long-poll")
report.sse = await latency("sse")
console.log(JSON.stringify(report))
