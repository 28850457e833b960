// Copies htmx and its SSE support (scripts that set up the global `htmx`, no imports), with their
// licences, into the demo's static files, for the pages that follow an answer with htmx: htmx 4
// with its hx-sse extension (both in the htmx.org package), and htmx 2 (the alias htmx.org-2) with
// htmx-ext-sse. Run it after changing the pinned versions: cd node && npm ci && npm run vendor-htmx
import { copyFileSync, readFileSync } from "node:fs"

const to = "../demo_project/chat/static/chat/vendor"
// [package, the name of its licence's copy, [[a script in the package, the name of its copy]...]]
for (const [name, licence, scripts] of [
  ["htmx.org", "htmx-4", [["dist/htmx.min.js", "htmx-4.min.js"], ["dist/ext/hx-sse.min.js", "htmx-4-hx-sse.min.js"]]],
  ["htmx.org-2", "htmx", [["dist/htmx.min.js", "htmx.min.js"]]],
  ["htmx-ext-sse", "htmx-ext-sse", [["dist/sse.min.js", "htmx-ext-sse.js"]]],
]) {
  const from = `node_modules/${name}`
  const { version } = JSON.parse(readFileSync(`${from}/package.json`, "utf8"))
  for (const [script, vendored] of scripts) {
    copyFileSync(`${from}/${script}`, `${to}/${vendored}`)
    console.log(`vendored ${name} ${version} ${script} into ${to}/${vendored}`)
  }
  copyFileSync(`${from}/LICENSE`, `${to}/${licence}.LICENSE`)
}
