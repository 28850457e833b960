// The Durable Streams protocol's Node reference server (@durable-streams/server), for the
// benchmark (bench/durable.py): file-backed (an append-only log per stream, fdatasync'd on each
// append, and metadata in LMDB), on a loopback port. Prints its URL, then serves until killed.
// Usage: node reference_server.mjs <port> <data dir>
import { DurableStreamTestServer } from "@durable-streams/server"

const [port, dataDir] = process.argv.slice(2)
const server = new DurableStreamTestServer({ host: "127.0.0.1", port: Number(port), dataDir, longPollTimeout: 20000 })
console.log(await server.start())
