// Copies htmx and its SSE extension (scripts that set up the global `htmx`, no imports) with their
// licences into the demo's static files, for the page that follows an answer with htmx. Run it
// after changing the pinned versions: cd node && npm ci && npm run vendor-htmx
import { copyFileSync, readFileSync } from "node:fs"

const to = "../demo_project/chat/static/chat/vendor"
for (const [name, script, vendored] of [
  ["htmx.org-2", "dist/htmx.min.js", "htmx.min.js"],
  ["htmx-ext-sse", "dist/sse.min.js", "htmx-ext-sse.js"],
]) {
  const from = `node_modules/${name}`
  const { version } = JSON.parse(readFileSync(`${from}/package.json`, "utf8"))
  copyFileSync(`${from}/${script}`, `${to}/${vendored}`)
  copyFileSync(`${from}/LICENSE`, `${to}/${vendored.replace(/(\.min)?\.js$/, "")}.LICENSE`)
  console.log(`vendored ${name} ${version} into ${to}/${vendored}`)
}
