// Builds transform.js into a component with componentize-js (SpiderMonkey); build.sh runs it.
//
//   node componentize.mjs WIT_DIR OUT.wasm
//
// Every optional feature is disabled: a transform may import nothing but the contract, and
// with `stdio`, `random` or `clocks` left on the component would import WASI interfaces the
// host does not offer.
//
// transform.js imports the SDK as `./zipline/sdk/js/zipline-transform.js`, which the engine
// reads while the component is built, from the directory componentize-js maps as its root:
// the working directory when the source lies under it. So this runs from the project's
// directory, and the SDK needs no bundler.
import { componentize } from "@bytecodealliance/componentize-js";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const [witPath, out] = process.argv.slice(2).map((p) => path.resolve(p));
const here = path.dirname(fileURLToPath(import.meta.url));
process.chdir(here);
const { component } = await componentize({
  sourcePath: path.join(here, "transform.js"),
  witPath,
  worldName: "transform",
  disableFeatures: ["stdio", "random", "clocks", "http", "fetch-event"],
});
fs.writeFileSync(out, component);
