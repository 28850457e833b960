// Copies the official Durable Streams client (an ES module with no imports of its own) and its
// licence into the demo's static files, for the page that reads an answer with it. Run it after
// changing the pinned version: cd node && npm ci && npm run vendor-client
import { copyFileSync, readFileSync } from "node:fs"

const from = "node_modules/@durable-streams/client"
const to = "../demo_project/chat/static/chat/vendor"
const { version } = JSON.parse(readFileSync(`${from}/package.json`, "utf8"))
const source = readFileSync(`${from}/dist/index.js`, "utf8")
copyFileSync(`${from}/dist/index.js`, `${to}/durable-streams-client.js`)
copyFileSync(`${from}/LICENSE`, `${to}/durable-streams-client.LICENSE`)
console.log(`vendored @durable-streams/client ${version} (${source.length} characters) into ${to}`)
