// The reference: Hugging Face's tokenizers library (the npm package
// `tokenizers`, its Rust code behind a Node binding), run on one file.
//
//   node reference.js TOKENIZER_JSON FILE encode|encode-special|decode
//
// encode: FILE's text -> ids, one per line (add_special_tokens false);
// encode-special: the same with special tokens; decode: FILE's ids
// (whitespace-separated) -> text, special tokens kept.
'use strict';
const fs = require('fs');
const { Tokenizer } = require('tokenizers');

async function main() {
  const [json, file, mode] = process.argv.slice(2);
  const tok = Tokenizer.fromFile(json);
  if (mode === 'decode') {
    const ids = fs.readFileSync(file, 'utf8').split(/\s+/).filter((s) => s.length).map(Number);
    process.stdout.write(await tok.decode(ids, false));
    return;
  }
  if (mode !== 'encode' && mode !== 'encode-special') throw new Error(`unknown mode ${mode}`);
  // fatal: a file that is not UTF-8 is an error here, not replaced characters
  const text = new TextDecoder('utf-8', { fatal: true }).decode(fs.readFileSync(file));
  const enc = await tok.encode(text, null, { addSpecialTokens: mode === 'encode-special' });
  process.stdout.write(enc.getIds().join('\n') + (enc.getIds().length ? '\n' : ''));
}

main().catch((e) => {
  console.error(`reference.js: ${e.stack || e}`);
  process.exit(1);
});
