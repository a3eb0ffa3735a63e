// The tokenizers library's encode throughput on files (Hugging Face's Rust
// library behind its Node binding): the reference half of bench/tokenizer/vs-hf.
//
//   NODE_PATH=... node reference.js TOKENIZER_JSON FILE...
//
// The same lines as bench/tokenizer_json prints: name, bytes, tokens, the best
// of 3 encode() calls in seconds, MB/s.
'use strict';
const fs = require('fs');
const path = require('path');
const { Tokenizer } = require('tokenizers');

async function main() {
  const [json, ...files] = process.argv.slice(2);
  let t = process.hrtime.bigint();
  const tok = Tokenizer.fromFile(json);
  console.log(`load\t${(Number(process.hrtime.bigint() - t) / 1e9).toFixed(3)} s`);
  for (const file of files) {
    const bytes = fs.readFileSync(file);
    const text = bytes.toString('utf8');
    let best = Infinity;
    let tokens = 0;
    for (let rep = 0; rep < 3; ++rep) {
      t = process.hrtime.bigint();
      const enc = await tok.encode(text, null, { addSpecialTokens: false });
      tokens = enc.getIds().length;
      best = Math.min(best, Number(process.hrtime.bigint() - t) / 1e9);
    }
    console.log(`${path.basename(file)}\t${bytes.length}\t${tokens}\t${best.toFixed(4)}\t${(bytes.length / best / 1e6).toFixed(2)}`);
  }
}

main().catch((e) => {
  console.error(`reference.js: ${e.stack || e}`);
  process.exit(1);
});
