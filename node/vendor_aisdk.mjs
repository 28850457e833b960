// Bundles the demo's AI SDK chat page (aisdk_page.jsx: useChat from @ai-sdk/react, with ai and
// React) into the demo's static files, with the licences of every package in the bundle: once
// with the newest majors (aisdk-chat.js: ai 7, @ai-sdk/react 4), once with ai 6 and @ai-sdk/react 3
// (aisdk-chat-6.js, the aliased packages; its ai is the copy @ai-sdk/react 3 pins, so the bundle
// holds one). Run it after changing the page or the pinned versions:
// cd node && npm ci && npm run vendor-aisdk
import { existsSync, readFileSync, readdirSync, statSync, writeFileSync } from "node:fs"
import { dirname, join } from "node:path"
import { build } from "esbuild"

const to = process.env.AISDK_VENDOR_DIR ?? "../demo_project/chat/static/chat/vendor" // a test builds elsewhere
const builds = {
  "aisdk-chat": { alias: {}, websocket: 'export { WebSocketChatTransport } from "ai"' },
  "aisdk-chat-6": {
    alias: { "@ai-sdk/react": "@ai-sdk/react-6", ai: "./node_modules/@ai-sdk/react-6/node_modules/ai" },
    websocket: "export const WebSocketChatTransport = undefined", // ai 6 has none
  },
}
for (const [name, { alias, websocket }] of Object.entries(builds)) await bundle(name, alias, websocket)

// The page's "websocket-transport" import: what the build's ai has of a WebSocket transport.
function websocketTransport(contents) {
  return {
    name: "websocket-transport",
    setup(build) {
      build.onResolve({ filter: /^websocket-transport$/ }, () => ({ path: "websocket-transport", namespace: "page" }))
      build.onLoad({ filter: /.*/, namespace: "page" }, () => ({ contents, resolveDir: process.cwd() }))
    },
  }
}

async function bundle(name, alias, websocket) {
const result = await build({
  entryPoints: ["aisdk_page.jsx"],
  bundle: true,
  format: "esm",
  target: "es2022",
  minify: true,
  jsx: "automatic",
  alias,
  plugins: [websocketTransport(websocket)],
  define: { "process.env.NODE_ENV": '"production"' },
  outfile: `${to}/${name}.js`,
  metafile: true,
  logLevel: "error",
  legalComments: "none", // the licences are in the .LICENSES.txt beside it, whole
})

// Each package the bundle holds code of, by the package.json nearest its files.
const packages = new Map()
for (const input of Object.keys(result.metafile.inputs)) {
  if (!input.includes("node_modules/")) continue
  let dir = dirname(input)
  while (!existsSync(join(dir, "package.json"))) dir = dirname(dir)
  const { name, version, license } = JSON.parse(readFileSync(join(dir, "package.json"), "utf8"))
  if (name && !packages.has(name)) packages.set(name, { dir, version, license })
}
let text = `The packages bundled in ${name}.js, each with its licence.\n`
for (const [name, { dir, version, license }] of [...packages].sort()) {
  const file = readdirSync(dir).find((f) => /^licen[cs]e/i.test(f) && statSync(join(dir, f)).isFile())
  const body = file ? readFileSync(join(dir, file), "utf8").trim() : `(no licence file; package.json says ${license})`
  text += `\n==== ${name} ${version} (${license}) ====\n\n${body}\n`
}
writeFileSync(`${to}/${name}.LICENSES.txt`, text)
const size = statSync(`${to}/${name}.js`).size
const names = [...packages].map(([name, { version }]) => `${name} ${version}`).join(", ")
console.log(`bundled ${packages.size} packages (${names}) into ${to}/${name}.js, ${size} bytes`)
}
