// Stands in for `zipline:transform/host@0.3.0` in the unit tests: records what is logged.
export const logged = [];

export function log(level, message) {
  logged.push([level, message]);
}
