// The suite exports vitest describe blocks; its own CLI skips files under node_modules, so it
// runs from this file: CONFORMANCE_TEST_URL=http://127.0.0.1:PORT/pgstreams npx vitest run
import { runConformanceTests } from "@durable-streams/server-conformance-tests"

runConformanceTests({ baseUrl: process.env.CONFORMANCE_TEST_URL })
