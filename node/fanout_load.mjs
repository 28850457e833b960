// The fan-out benchmark's subscribers (bench/fanout.py runs them): N subscribers of each of the
// given streams, over WebSocket (acking as pgstreams.js does), pgstreams' SSE, Durable Streams SSE
// or long-poll, or ai 7's WebSocket chat transport (a socket per subscriber, resuming the chat
// whose id is the stream's, as WebSocketChatTransport does: its frames, a chunk each), against
// pgstreams or (but the last) against the raw ASGI ceiling alike. Every chunk's
// data is the wall-clock time it was written (seconds, a JSON number): a delivery's latency is its
// receipt's wall-clock time less that. Prints one JSON object: deliveries, latencies as a
// histogram of 0.1 ms buckets, duplicates, gaps, each stream's highest offset seen by each
// subscriber, errors and this process's CPU seconds. Once every subscriber has connected (or failed to), it writes "ready" to stderr, and follows
// for `seconds` from then.
// Usage: node fanout_load.mjs '<options as JSON>'
//   base        http://host:port of the server
//   transport   ws | sse | ds-sse | ds-lp | aisdk-ws
//   streams     [{id, path}] the streams to follow
//   subscribers how many subscribers of each stream
//   seconds     how long to follow once all are connected (the writers stop earlier)
//   chunks      (optional) chunks per stream: a subscriber leaves once it has the last (for the
//               raw ceiling, whose streams have no end)
//   idle        true: open the connections, receive nothing, report after `seconds`
import { performance } from "node:perf_hooks"
import WebSocket from "ws"
import { events } from "./sse.mjs"

const o = JSON.parse(process.argv[2])
// When a WebSocket subscriber acks, as pgstreams.js does: after 128 chunks or ACK_CHARS characters
// of frames, else ACK_DELAY ms after the first chunk it has not acknowledged.
const ACK_CHARS = 256 * 1024
const ACK_DELAY = 1000
const origin = o.base.replace(/^http/, "ws")
const buckets = new Map() // 0.1 ms bucket -> deliveries
let deliveries = 0
let duplicates = 0
let gaps = 0
const errors = []
const cpuStart = process.cpuUsage()

// Every subscriber connects (or fails to) once; then all follow for o.seconds (or, given
// o.chunks, until each has its stream's last), and leave.
let settled = 0
let total = 0
const leaving = new Set() // each subscriber's way to leave
function connected() {
  if (++settled === total) {
    process.stderr.write("ready\n")
    setTimeout(() => leaving.forEach((leave) => leave()), o.seconds * 1000)
  }
}

function wallSeconds() {
  return (performance.timeOrigin + performance.now()) / 1000
}

function delivered(written) {
  const bucket = Math.max(0, Math.round((wallSeconds() - Number(written)) * 10000))
  buckets.set(bucket, (buckets.get(bucket) || 0) + 1)
  deliveries++
}

class Position {
  constructor(index) {
    this.index = index
    this.next = 0
    this.leave = () => {} // its subscriber's way to leave, once it has one
  }

  take(offset, data) {
    if (offset < this.next) {
      duplicates++
      return
    }
    if (offset > this.next) gaps++
    this.next = offset + 1
    delivered(data)
    if (o.chunks && this.next >= o.chunks) this.leave()
  }
}

// A subscriber's WebSocket to `path`: counted connected once open (or closed without opening),
// left by closing it, its errors kept; `onOpen(ws)` and `onMessage(ws, raw)` are the protocol's,
// `onClose()` runs as it closes.
function subscriberSocket(path, position, { onOpen = () => {}, onMessage, onClose = () => {} }) {
  return new Promise((resolve) => {
    const ws = new WebSocket(`${origin}${path}`, { perMessageDeflate: false, headers: { Origin: o.base } })
    let opened = false
    const leave = () => ws.close(1000)
    leaving.add(leave)
    position.leave = leave
    ws.on("open", () => {
      opened = true
      onOpen(ws)
      connected()
    })
    ws.on("message", (raw) => onMessage(ws, raw))
    ws.on("error", (error) => errors.length < 20 && errors.push(String(error)))
    ws.on("close", () => {
      onClose()
      leaving.delete(leave)
      if (!opened) connected() // it never will
      resolve()
    })
  })
}

function websocket(stream, position) {
  let acked = 0
  let chars = 0 // of the frames read since the last ack
  let frame = null
  let timer = null
  const ack = (ws) => {
    timer = null
    if (ws.readyState === WebSocket.OPEN && position.next > acked) {
      ws.send(JSON.stringify({ type: "ack", frame }))
      acked = position.next
      chars = 0
    }
  }
  return subscriberSocket(`/ws/pgstreams/${stream.id}/?from=0`, position, {
    onMessage(ws, raw) {
      const message = JSON.parse(raw)
      if (message.type === "chunks") {
        if (!o.idle) for (const item of message.items) position.take(item.offset, item.data)
        frame = message.frame
        chars += String(raw).length
        if (position.next - acked >= 128 || chars >= ACK_CHARS) {
          clearTimeout(timer)
          ack(ws)
        } else if (!timer) timer = setTimeout(ack, ACK_DELAY, ws)
      } else if (message.type === "end") ws.close(1000)
    },
    onClose: () => clearTimeout(timer),
  })
}

function chatWebsocket(stream, position) {
  return subscriberSocket("/ws/bench/chat/", position, {
    onOpen(ws) {
      ws.send(JSON.stringify({ type: "resume", requestId: "r1", id: stream.id, headers: {}, body: {}, metadata: null }))
    },
    onMessage(ws, raw) {
      const message = JSON.parse(raw)
      if (message.type === "chunk") {
        if (!o.idle) position.take(message.sequence, message.chunk)
      } else if (message.type === "end") ws.close(1000)
      else if (message.type !== "start" && errors.length < 20) errors.push(String(raw).slice(0, 200))
    },
  })
}

async function sse(url, position, onEvent) {
  const controller = new AbortController()
  const leave = () => controller.abort()
  leaving.add(leave)
  position.leave = leave
  let opened = false
  try {
    const response = await fetch(url, { signal: controller.signal })
    opened = true
    connected()
    for await (const [event, data] of events(response)) if (onEvent(event, data) === "end") break
  } catch (error) {
    if (error.name !== "AbortError" && errors.length < 20) errors.push(String(error))
  } finally {
    if (!opened) connected()
    leaving.delete(leave)
    controller.abort()
  }
}

function pgstreamsSse(stream, position) {
  return sse(`${o.base}/pgstreams/streams/${stream.id}/events?from=0`, position, (event, data) => {
    if (event === "end") return "end"
    if (event === "message" && !o.idle) {
      const item = JSON.parse(data)
      position.take(item.offset, item.data)
    }
  })
}

const START = "0000000000000000_0000000000000000"

function durableSse(stream, position) {
  let messages = []
  const url = `${o.base}/pgstreams/v1/stream/${stream.path}?offset=${START}&live=sse`
  return sse(url, position, (event, data) => {
    if (event === "data") messages = JSON.parse(data)
    else if (event === "control") {
      const control = JSON.parse(data)
      const end = Number(control.streamNextOffset.split("_")[0])
      if (!o.idle) messages.forEach((m, i) => position.take(end - messages.length + i, m))
      messages = []
      if (control.streamClosed) return "end"
    }
  })
}

async function durableLongPoll(stream, position) {
  let offset = START
  let first = true
  let left = false
  const leave = () => (left = true)
  leaving.add(leave)
  while (!left) {
    try {
      const url = `${o.base}/pgstreams/v1/stream/${stream.path}?offset=${offset}&live=long-poll`
      const response = await fetch(url)
      if (first) {
        first = false
        connected()
      }
      const body = response.status === 200 ? await response.json() : (await response.arrayBuffer(), [])
      const next = response.headers.get("Stream-Next-Offset")
      const end = Number(next.split("_")[0])
      body.forEach((m, i) => position.take(end - body.length + i, m))
      offset = next
      if (response.headers.get("Stream-Closed") === "true") break
    } catch (error) {
      if (errors.length < 20) errors.push(String(error))
      break
    }
  }
  if (first) connected()
  leaving.delete(leave)
}

const follow = {
  ws: websocket,
  sse: pgstreamsSse,
  "ds-sse": durableSse,
  "ds-lp": durableLongPoll,
  "aisdk-ws": chatWebsocket,
}[o.transport]
const positions = []
const followers = []
total = o.streams.length * o.subscribers
o.streams.forEach((stream, index) => {
  for (let k = 0; k < o.subscribers; k++) {
    const position = new Position(index)
    positions.push(position)
    followers.push(follow(stream, position))
  }
})
await Promise.all(followers)
const cpu = process.cpuUsage(cpuStart)
const report = JSON.stringify({
  deliveries,
  duplicates,
  gaps,
  histogram: Object.fromEntries(buckets),
  highest: positions.map((p) => [p.index, p.next]),
  errors,
  cpu_seconds: (cpu.user + cpu.system) / 1e6,
  rss_bytes: process.memoryUsage().rss,
})
// Exit once the report is written out: a pipe takes it in parts, and exit() would cut it short.
process.stdout.write(report, () => process.exit(0))
