#!/usr/bin/env node
// engram_trace.mjs: turns real text into an Engram token trace for bench/store/engram-trace-replay:
// every document tokenised with a real BPE tokenizer, each token id mapped to a compressed id
// the way DeepSeek-V4.1 compresses its vocabulary (docs/row-store.md, "Traces"), written as
// one sequence of compressed ids per document.
//
//   npm install --prefix tools/trace        # gpt-tokenizer (MIT), from the npm registry
//   node tools/trace/engram_trace.mjs --out /var/tmp/debian-doc.trace [--docs /usr/share/doc]
//
// Text: the files under --docs (default /usr/share/doc: README, NEWS, changelogs, copyright
// notices and manuals of the installed Debian packages, plain or gzip), in sorted path order,
// each one a document. Only token ids leave the tool, never text.
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { encode, decode } from 'gpt-tokenizer/encoding/cl100k_base';

function parseArgs(argv) {
  const args = { docs: '/usr/share/doc', out: '', maxTokens: 2_000_000, minTokens: 64 };
  for (let i = 2; i < argv.length; ++i) {
    const next = () => {
      if (i + 1 >= argv.length) throw new Error(`${argv[i]} needs a value`);
      return argv[++i];
    };
    if (argv[i] === '--docs') args.docs = next();
    else if (argv[i] === '--out') args.out = next();
    else if (argv[i] === '--max-tokens') args.maxTokens = Number(next());
    else if (argv[i] === '--min-tokens') args.minTokens = Number(next());
    else throw new Error(`unknown argument ${argv[i]} (--docs DIR --out FILE --max-tokens N)`);
  }
  if (!args.out) throw new Error('--out FILE is required');
  return args;
}

function listFiles(dir) {
  const out = [];
  const walk = (d) => {
    let entries;
    try {
      entries = fs.readdirSync(d, { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.isFile()) out.push(p);
    }
  };
  walk(dir);
  return out;
}

// The text of a file, or null for binaries (a NUL byte, or not UTF-8 enough).
function readText(file) {
  let bytes = fs.readFileSync(file);
  if (file.endsWith('.gz')) {
    try {
      bytes = zlib.gunzipSync(bytes);
    } catch {
      return null;
    }
  }
  if (bytes.includes(0)) return null;
  const text = bytes.toString('utf8');
  const bad = (text.match(/\uFFFD/g) || []).length;
  return bad * 100 > text.length ? null : text;
}

// The reference normalisation of a token's text (engram_demo_v1.py, docs/hashing.md): NFKC,
// NFD, accents stripped, lower case, whitespace runs collapsed to one space, stripped; a token
// that is only whitespace stays one space; a token whose text has the replacement character
// (a piece of a multi-byte character) keeps its own raw identity.
function normalise(id) {
  const text = decode([id]);
  if (text.includes('\uFFFD')) return `\u0000raw${id}`;
  let s = text.normalize('NFKC').normalize('NFD').replace(/\p{M}/gu, '').toLowerCase();
  s = s.replace(/\s+/g, ' ').trim();
  if (s === '' && /\s/.test(text)) s = ' ';
  return s;
}

// Maps tokenizer ids to compressed ids: ids whose normalised text is equal share one, numbered
// in order of first appearance. Returns the mapping function and the table of texts seen.
function makeCompressor() {
  const lookup = new Map();  // tokenizer id -> compressed id
  const byText = new Map();  // normalised text -> compressed id
  const compress = (id) => {
    let c = lookup.get(id);
    if (c === undefined) {
      const key = normalise(id);
      c = byText.get(key);
      if (c === undefined) {
        c = byText.size;
        byText.set(key, c);
      }
      lookup.set(id, c);
    }
    return c;
  };
  return { compress, byText };
}

// Tokenizer ids are compressed in id order, as the reference numbers them: walk the whole
// vocabulary first so that compressed ids do not depend on the text. Returns the tokenizer's
// vocabulary size.
function compressVocabulary(compress) {
  let vocab = 0;
  for (let id = 0; id < 200_000; ++id) {
    try {
      decode([id]);
    } catch {
      break;
    }
    compress(id);
    vocab = id + 1;
  }
  return vocab;
}

// Each readable file under args.docs with at least args.minTokens tokens, as compressed ids, until
// args.maxTokens tokens in all.
function readDocs(args, compress) {
  const docs = [];
  let total = 0, files = 0;
  for (const file of listFiles(args.docs)) {
    if (total >= args.maxTokens) break;
    const text = readText(file);
    if (text === null) continue;
    ++files;
    const ids = encode(text, { disallowedSpecial: new Set() });
    if (ids.length < args.minTokens) continue;
    const n = Math.min(ids.length, args.maxTokens - total);
    const out = new Uint32Array(n);
    for (let i = 0; i < n; ++i) out[i] = compress(ids[i]);
    docs.push(out);
    total += n;
  }
  return { docs, total, files };
}

// File: "ENGTRC01", u32 version 1, u32 documents, u32 compressed vocabulary size, u32
// compressed pad id, u64 tokens; then per document u32 n and n u32 compressed ids (LE).
function writeTrace(file, docs, compressedVocab, pad, total) {
  const header = Buffer.alloc(32);
  header.write('ENGTRC01', 0, 'latin1');
  header.writeUInt32LE(1, 8);
  header.writeUInt32LE(docs.length, 12);
  header.writeUInt32LE(compressedVocab, 16);
  header.writeUInt32LE(pad, 20);
  header.writeBigUInt64LE(BigInt(total), 24);
  const fd = fs.openSync(file, 'w');
  fs.writeSync(fd, header);
  for (const d of docs) {
    const n = Buffer.alloc(4);
    n.writeUInt32LE(d.length, 0);
    fs.writeSync(fd, n);
    fs.writeSync(fd, Buffer.from(d.buffer, d.byteOffset, d.byteLength));
  }
  fs.closeSync(fd);
}

function main() {
  const args = parseArgs(process.argv);
  const { compress, byText } = makeCompressor();
  const vocab = compressVocabulary(compress);
  const pad = compress(2);  // DeepSeek-V4.1's engram_pad_token_id is 2; its compressed id here
  const { docs, total, files } = readDocs(args, compress);
  writeTrace(args.out, docs, byText.size, pad, total);
  const info = {
    tokenizer: 'gpt-tokenizer 4.0.0, cl100k_base (MIT)',
    tokenizer_vocab: vocab,
    compressed_vocab: byText.size,
    compressed_pad_id: pad,
    text: args.docs,
    files_read: files,
    documents: docs.length,
    tokens: total,
  };
  fs.writeFileSync(args.out + '.json', JSON.stringify(info, null, 2) + '\n');
  console.log(JSON.stringify(info));
}

try {
  main();
} catch (e) {
  console.error(`engram_trace: ${e.message}`);
  process.exit(1);
}
