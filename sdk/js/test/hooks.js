// Module resolution hooks for the unit tests: the contract's host interface, which only a
// component build provides, resolves to the stand-in `host.js`.
export async function resolve(specifier, context, next) {
  if (specifier === "zipline:transform/host@0.3.0") {
    return { url: new URL("./host.js", import.meta.url).href, shortCircuit: true };
  }
  return next(specifier, context);
}
