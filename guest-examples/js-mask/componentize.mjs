// Builds transform.js into a component with componentize-js (SpiderMonkey); build.sh runs it.
//
//   node componentize.mjs WIT_DIR OUT.wasm
//
// Every optional feature is disabled: a transform may import nothing but
// `zipline:transform/host`, and with `stdio`, `random` or `clocks` left on the component would
// import WASI interfaces the host does not offer.
import { componentize } from "@bytecodealliance/componentize-js";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const [witPath, out] = process.argv.slice(2);
const here = path.dirname(fileURLToPath(import.meta.url));
const { component } = await componentize({
  sourcePath: path.join(here, "transform.js"),
  witPath,
  worldName: "transform",
  disableFeatures: ["stdio", "random", "clocks", "http", "fetch-event"],
});
fs.writeFileSync(out, component);
