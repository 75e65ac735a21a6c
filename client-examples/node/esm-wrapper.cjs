// Writes the ES module entry of the package after tsc has built the CommonJS one (dist/):
// dist/esm/index.mjs re-exports every name of dist/index.js (Node's "ES module wrapper" for a
// dual package: one copy of the code, so `import` and `require` share the same classes and
// `instanceof` holds across them), and dist/esm/index.d.mts its types. Run by `npm run build`.
"use strict";
const fs = require("node:fs");
const path = require("node:path");

const dist = path.join(__dirname, "dist");
const names = Object.keys(require(path.join(dist, "index.js"))).filter((n) => n !== "default" && n !== "__esModule");
fs.mkdirSync(path.join(dist, "esm"), { recursive: true });
fs.writeFileSync(
  path.join(dist, "esm", "index.mjs"),
  "// The ES module entry of @window-sidecar/client: the CommonJS build's names (see esm-wrapper.cjs).\n" +
    'import cjs from "../index.js";\n' +
    `export const { ${names.join(", ")} } = cjs;\n` +
    "export default cjs;\n",
);
fs.writeFileSync(
  path.join(dist, "esm", "index.d.mts"),
  'export * from "../index.js";\nimport * as cjs from "../index.js";\nexport default cjs;\n',
);
console.log(`esm-wrapper: dist/esm/index.mjs re-exports ${names.length} names`);
