// Run by `npm pack` and `npm publish` (the "prepack" script): puts the repository's proto into
// the package, which ships it (proto/attnserve/v1/attention.proto), so that the repository keeps
// one copy of it (proto/ at its root). Pack from a checkout of the repository.
'use strict';
const fs = require('node:fs');
const path = require('node:path');

const rel = path.join('attnserve', 'v1', 'attention.proto');
const src = path.join(__dirname, '..', '..', 'proto', rel);
const dst = path.join(__dirname, 'proto', rel);
if (!fs.existsSync(src)) {
  console.error(`prepack: ${src} not found: pack client/node from a checkout of attnserve`);
  process.exit(1);
}
fs.mkdirSync(path.dirname(dst), { recursive: true });
fs.copyFileSync(src, dst);
