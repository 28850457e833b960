// The soak's AI SDK reader: every AI SDK answer the soak's writer starts (its path has
// "/answer/"), read once from its first part by the SDK's own pieces, as the Durable Streams chat
// transport reads one (@durable-streams/aisdk-transport): the Durable Streams client following
// the answer's stream over SSE as JSON, and the AI SDK's readUIMessageStream making the message.
// What each read gave (the parts, in order, and the message) is written to the run's record as
// JSON lines (bench/soak/record.py); an answer pruned before it was read whole is noted as gone.
//
//   node soak_aisdk.mjs '{"runDir": "...", "name": "aisdk0-0"}'
//
// It reads through the servers' client proxies (the run's config.json). The answers are found in
// the writers' records ({"e": "generation", "s": path}). A read that fails or ends early (a cut
// connection, a server killed) is noted and read again from the start. Once the run settles and
// every answer found has been read, it notes "done" and exits 0.
import { appendFileSync, closeSync, openSync, readdirSync, readFileSync, readSync, statSync } from "node:fs"
import { join } from "node:path"
import { stream } from "@durable-streams/client"
import { readUIMessageStream } from "ai"

const options = JSON.parse(process.argv[2])
const logFile = join(options.runDir, "log", `${options.name}.jsonl`)
const AT_ONCE = 4 // answers read at once
const GONE = new Set([404, 410]) // a pruned answer
const READ_TIMEOUT = 60_000 // ms: a read not done by then is given up and read again
const { hosts } = JSON.parse(readFileSync(join(options.runDir, "config.json"), "utf8"))

function note(event) {
  appendFileSync(logFile, `${JSON.stringify(event)}\n`)
}

function settling() {
  try {
    return readFileSync(join(options.runDir, "phase"), "utf8").trim() === "settle"
  } catch {
    return false
  }
}

// The AI SDK answers the writers started, from their records as they grow: each file read from
// where the last look left it, whole lines only.
const known = []
const readUpTo = new Map() // record file -> bytes looked at
function answers() {
  const folder = join(options.runDir, "log")
  for (const file of readdirSync(folder)) {
    if (!file.startsWith("writer")) continue
    const path = join(folder, file)
    const from = readUpTo.get(file) ?? 0
    const size = statSync(path).size
    if (size <= from) continue
    const bytes = Buffer.alloc(size - from)
    const fd = openSync(path, "r")
    try {
      readSync(fd, bytes, 0, bytes.length, from)
    } finally {
      closeSync(fd)
    }
    const whole = bytes.lastIndexOf(10) + 1 // up to the last newline
    readUpTo.set(file, from + whole)
    for (const line of bytes.subarray(0, whole).toString("utf8").split("\n")) {
      if (!line.includes('"generation"')) continue
      try {
        const event = JSON.parse(line)
        if (event.e === "generation" && event.s.includes("/answer/")) known.push(event.s)
      } catch {} // a line cut short by SIGKILL
    }
  }
  return known
}

function toReadableStream(iterable) {
  const iterator = iterable[Symbol.asyncIterator]()
  return new ReadableStream({
    async pull(controller) {
      const { done, value } = await iterator.next()
      if (done) controller.close()
      else controller.enqueue(value)
    },
    async cancel() {
      await iterator.return?.()
    },
  })
}

async function read(path, attempt, seen) {
  const host = hosts[attempt % hosts.length]
  const signal = AbortSignal.timeout(READ_TIMEOUT)
  note({ e: "aisdk-start", s: path, attempt })
  const response = await stream({
    url: `http://${host}/pgstreams/v1/stream/${path}`,
    offset: "-1",
    live: "sse",
    json: true,
    signal,
  })
  let message
  const parts = toReadableStream(response.jsonStream()).pipeThrough(
    new TransformStream({
      transform(part, controller) {
        seen.push([part.type, part.type === "text-delta" ? part.delta : null]) // as the client gave it
        controller.enqueue(part)
      },
    }),
  )
  for await (const made of readUIMessageStream({ stream: parts })) message = made
  const last = seen.at(-1)?.[0]
  if (last !== "finish") throw new EndedEarly(last)
  const texts = (message?.parts ?? []).filter((p) => p.type === "text").map((p) => p.text)
  note({ e: "aisdk-answer", s: path, texts, parts: (message?.parts ?? []).map((p) => p.type), seen, attempt })
}

// The client's stream of parts ended before the answer's last part: @durable-streams/client 0.2.7
// does so when a connection is cut in the middle of a response. The read starts again.
class EndedEarly extends Error {
  constructor(last) {
    super(`the parts ended after ${last}, before the answer's finish`)
  }
}

// A cut connection's error that escapes the client (undici's "terminated", unhandled) is noted,
// not fatal: the read it belonged to ends early or fails, and is read again.
process.on("unhandledRejection", (error) => note({ e: "aisdk-unhandled", why: String(error).slice(0, 200) }))

const finished = new Set()
const running = new Map()
let attempts = 0
while (true) {
  const ending = settling()
  for (const path of answers()) {
    if (finished.has(path) || running.has(path) || running.size >= AT_ONCE) continue
    const attempt = attempts++
    const seen = [] // each part the client gave this read: [type, delta]
    running.set(
      path,
      read(path, attempt, seen)
        .then(() => finished.add(path))
        .catch((error) => {
          if (GONE.has(error?.status)) {
            note({ e: "aisdk-gone", s: path, attempt }) // pruned: nothing more to read
            finished.add(path)
          } else note({ e: "aisdk-error", s: path, why: String(error).slice(0, 200), seen, attempt })
        })
        .finally(() => running.delete(path)),
    )
  }
  if (ending && running.size === 0 && answers().every((path) => finished.has(path))) break
  await new Promise((resolve) => setTimeout(resolve, 200))
}
note({ e: "done" })
