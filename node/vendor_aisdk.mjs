// Bundles the demo's AI SDK chat page (aisdk_page.jsx: useChat from @ai-sdk/react, with ai and
// React) into the demo's static files, with the licences of every package in the bundle. Run it
// after changing the page or the pinned versions: cd node && npm ci && npm run vendor-aisdk
import { existsSync, readFileSync, readdirSync, statSync, writeFileSync } from "node:fs"
import { dirname, join } from "node:path"
import { build } from "esbuild"

const to = process.env.AISDK_VENDOR_DIR ?? "../demo_project/chat/static/chat/vendor" // a test builds elsewhere
const result = await build({
  entryPoints: ["aisdk_page.jsx"],
  bundle: true,
  format: "esm",
  target: "es2022",
  minify: true,
  jsx: "automatic",
  define: { "process.env.NODE_ENV": '"production"' },
  outfile: `${to}/aisdk-chat.js`,
  metafile: true,
  legalComments: "none", // the licences are in aisdk-chat.LICENSES.txt, whole
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
let text = "The packages bundled in aisdk-chat.js, each with its licence.\n"
for (const [name, { dir, version, license }] of [...packages].sort()) {
  const file = readdirSync(dir).find((f) => /^licen[cs]e/i.test(f) && statSync(join(dir, f)).isFile())
  const body = file ? readFileSync(join(dir, file), "utf8").trim() : `(no licence file; package.json says ${license})`
  text += `\n==== ${name} ${version} (${license}) ====\n\n${body}\n`
}
writeFileSync(`${to}/aisdk-chat.LICENSES.txt`, text)
const size = statSync(`${to}/aisdk-chat.js`).size
console.log(`bundled ${packages.size} packages (${[...packages.keys()].join(", ")}) into ${to}/aisdk-chat.js, ${size} bytes`)
