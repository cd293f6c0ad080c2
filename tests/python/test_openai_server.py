"""dtorch-serve driven as a subprocess over HTTP by the official `openai` client, as a user of vLLM's
server would drive it: every endpoint and request field of the contract (DESIGN.md, "Text,
generation and serving"), against independent references: ``generate`` of the same prompt alone
for greedy replies (the server runs the models on other meshes and batches requests together),
the tokenizer's own decode and chat template for the text, numpy's log-softmax of the model's
logits for logprobs, numpy penalties over those logits, prometheus_client's own parser for
/metrics. The checkpoints are tiny random Llamas written here, each beside a tokenizer fixture whose
vocabulary it matches (byte-level BPE and sentencepiece-style), so text round-trips through real
tokenizers, non-ASCII included. One server runs in the process worker mode: a killed device fails
its model's requests with a 503 naming it while the other model keeps serving, and SIGTERM drains."""
import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

import numpy as np
import openai
import pytest
from prometheus_client import parser as prom_parser

import llama_reference as ref
from conftest import PATIENCE_S, wait_for, worker_pids
from dtorch.models import AutoTokenizer, LlamaConfig, LlamaForCausalLM

pytestmark = [pytest.mark.usefixtures("thread_runtime"),
              pytest.mark.filterwarnings("ignore:a sequence of .* tokens is longer")]   # the fixture's 24

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "tokenizers")
CONTEXT = 96                  # --max-model-len
EOS_PROMPT = "The eos test"   # a prompt whose 4th greedy token is made an end token of "byte"


def _checkpoint(directory, tokenizer_fixture, seed, **overrides):
    """A tiny random Llama whose vocabulary is the tokenizer fixture's, written with that tokenizer."""
    tok = AutoTokenizer.from_pretrained(os.path.join(FIXTURES, tokenizer_fixture))
    cfg = ref.tiny_config(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                          **overrides)
    model = LlamaForCausalLM(LlamaConfig.from_dict(cfg))
    model.load_state_dict(ref.random_weights(cfg, seed))
    model.save_pretrained(directory)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(FIXTURES, tokenizer_fixture, f), directory)
    return str(directory)


class Reference:
    """A checkpoint's model on one device of this process and its tokenizer: what replies must be."""

    def __init__(self, directory, eos):
        self.model = LlamaForCausalLM.from_pretrained(directory)
        self.tok = AutoTokenizer.from_pretrained(directory)
        self.eos = sorted(eos)

    def greedy(self, ids, max_tokens):
        """generate() of the prompt alone, up to and with the first end token."""
        out = self.model.generate(np.array([ids]), max_new_tokens=max_tokens, eos_token_id=self.eos)[0, len(ids):]
        out = out.tolist()
        for i, t in enumerate(out):
            if t in self.eos:
                return out[:i + 1]
        return out

    def text(self, tokens):
        return self.tok.decode([t for t in tokens if t not in self.eos], skip_special_tokens=True)

    def log_softmax(self, ids):
        """log_softmax (len(ids), V) of the model's logits over ids, in float64 numpy."""
        logits = self.model(np.array([ids])).logits.numpy()[0].astype(np.float64)
        top = logits.max(-1, keepdims=True)
        return logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))


class ServerProcess:
    """`python -m dtorch.serve ARGS --port 0` and its URL."""

    def __init__(self, args):
        self.log = tempfile.TemporaryFile("w+")        # a file, not a pipe: nobody reads it while it runs
        self.proc = subprocess.Popen([sys.executable, "-m", "dtorch.serve", *args, "--port", "0"],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()
        if "serving" not in line:
            self.proc.kill()
            self.proc.wait()
            self.log.seek(0)
            raise RuntimeError(f"the server did not start: {line}{self.log.read()}")
        self.url = line.rsplit(" at ", 1)[1].strip()
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=PATIENCE_S)

    def get(self, path):
        try:
            with urllib.request.urlopen(self.url + path, timeout=PATIENCE_S) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def post(self, path, body):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=PATIENCE_S) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def stop(self):
        """SIGTERM; the exit status (it drains and exits by itself)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.communicate(timeout=PATIENCE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
        return self.proc.returncode


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Two checkpoints and the server: "byte" (byte-level BPE) on tp=2, "spm" (sentencepiece-style,
    served by --served-model-name) on one device, and "byte" again on pp, dp x ulysses and ring
    meshes; "byte"'s generation_config.json makes one more token an end token."""
    root = tmp_path_factory.mktemp("openai")
    byte = _checkpoint(root / "byte", "bytelevel", 11)
    spm = _checkpoint(root / "spm-checkpoint", "spm", 12)
    refs = {"byte": Reference(byte, set()), "spm": Reference(spm, set())}
    tok = refs["byte"].tok
    # the 4th greedy token of EOS_PROMPT (one not among the first three) becomes an end token too
    made = refs["byte"].greedy(tok.encode(EOS_PROMPT), 12)
    extra = next(t for i, t in enumerate(made) if i >= 3 and t not in made[:i])
    with open(os.path.join(byte, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [tok.eos_token_id, extra], "bos_token_id": tok.bos_token_id}, f)
    refs["byte"].eos = sorted({tok.eos_token_id, extra})
    refs["spm"].eos = [refs["spm"].tok.eos_token_id]
    for name in ("byte-pp", "byte-dp-ulysses", "byte-ring"):
        refs[name] = refs["byte"]
    # spm's weights with a generation_config.json whose top_k=1 is the default of requests that set none
    topk1 = shutil.copytree(spm, root / "spm-top-k-1")
    with open(os.path.join(topk1, "generation_config.json"), "w") as f:
        json.dump({"top_k": 1}, f)
    server = ServerProcess([byte, "--mesh", "byte=tp=2", "--model", f"spm={spm}", "--model", f"spm-top-k-1={topk1}",
                            "--model", f"byte-pp={byte}",
                            "--mesh", "byte-pp=pp=2", "--model", f"byte-dp-ulysses={byte}",
                            "--mesh", "byte-dp-ulysses=dp=2,ulysses=2", "--model", f"byte-ring={byte}",
                            "--mesh", "byte-ring=ring=2", "--max-model-len", str(CONTEXT), "--max-num-seqs", "4"])
    yield server, refs, {"byte": byte, "spm": spm, "extra_eos": extra}
    assert server.stop() == 0


def _ids(choice):
    return choice.token_ids


PROMPTS = ["Hello wörld", "Ünïcödé — ok?", "日本語のテキスト", "a", "Grüße 🙂 und mehr"]


# ---- the endpoints -----------------------------------------------------------------------------

def test_models_lists_every_model_by_its_served_name(world):
    server, _, _ = world
    models = server.client.models.list().data
    assert [m.id for m in models] == ["byte", "spm", "spm-top-k-1", "byte-pp", "byte-dp-ulysses", "byte-ring"]
    assert all(m.object == "model" and m.max_model_len == CONTEXT for m in models)


def test_default_served_name_is_the_directory_base_name(world):
    server, _, dirs = world
    names = [m.id for m in server.client.models.list().data]
    assert os.path.basename(dirs["byte"]) == "byte" == names[0]        # MODEL_DIR alone: its base name
    assert os.path.basename(dirs["spm"]) not in names                  # --model spm=DIR: the name given


def test_health(world):
    server, _, _ = world
    assert server.get("/health") == (200, "")


@pytest.mark.parametrize("name", ["byte", "spm", "byte-pp", "byte-dp-ulysses", "byte-ring"])
def test_completion_is_generate_of_the_prompt_alone_on_every_mesh(world, name):
    server, refs, _ = world
    r = refs[name]
    for prompt in PROMPTS[:3]:
        ids = r.tok.encode(prompt)
        reply = server.client.completions.create(model=name, prompt=prompt, max_tokens=10, temperature=0,
                                                 extra_body={"return_token_ids": True})
        want = r.greedy(ids, 10)
        choice = reply.choices[0]
        assert choice.prompt_token_ids == ids and _ids(choice) == want, (name, prompt)
        assert choice.text == r.text(want)
        assert choice.finish_reason == ("stop" if want[-1] in r.eos else "length")
        assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (len(ids), len(want))
        assert reply.object == "text_completion" and reply.model == name


def test_token_id_prompts_and_lists_of_prompts(world):
    server, refs, _ = world
    r = refs["spm"]
    prompts = [r.tok.encode(p) for p in PROMPTS[:3]]
    reply = server.client.completions.create(model="spm", prompt=prompts, max_tokens=5, temperature=0, n=2,
                                             extra_body={"return_token_ids": True})
    assert [c.index for c in reply.choices] == list(range(6))
    for c in reply.choices:
        assert _ids(c) == r.greedy(prompts[c.index // 2], 5)
    assert reply.usage.prompt_tokens == sum(len(p) for p in prompts)          # each prompt once, not per choice
    assert reply.usage.completion_tokens == sum(len(_ids(c)) for c in reply.choices)


def test_eight_concurrent_greedy_requests_each_equal_its_alone_run(world):
    server, refs, _ = world
    rng = np.random.default_rng(0)
    cases = [(["byte", "spm", "byte-pp"][i % 3], PROMPTS[i % len(PROMPTS)] * int(rng.integers(1, 3)),
              int(rng.integers(1, 14))) for i in range(8)]

    def one(case):
        name, prompt, k = case
        return server.client.completions.create(model=name, prompt=prompt, max_tokens=k, temperature=0,
                                                extra_body={"return_token_ids": True})

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(one, cases))
    for (name, prompt, k), reply in zip(cases, replies):
        r = refs[name]
        assert _ids(reply.choices[0]) == r.greedy(r.tok.encode(prompt), k), (name, prompt, k)


def test_chat_completion_applies_the_chat_template(world):
    server, refs, _ = world
    for name in ("byte", "spm"):
        r = refs[name]
        messages = [{"role": "system", "content": "Sei kurz."}, {"role": "user", "content": "Wie geht's? 🙂"}]
        ids = r.tok.apply_chat_template(messages, add_generation_prompt=True)
        reply = server.client.chat.completions.create(model=name, messages=messages, max_completion_tokens=8,
                                                      temperature=0, extra_body={"return_token_ids": True})
        choice = reply.choices[0]
        want = r.greedy(ids, 8)
        assert choice.prompt_token_ids == ids and _ids(choice) == want
        assert choice.message.role == "assistant" and choice.message.content == r.text(want)
        assert reply.object == "chat.completion" and reply.usage.prompt_tokens == len(ids)
        # text parts are joined as the content
        parts = server.client.chat.completions.create(
            model=name, messages=[messages[0], {"role": "user", "content": [{"type": "text", "text": "Wie geht's? 🙂"}]}],
            max_tokens=8, temperature=0)
        assert parts.choices[0].message.content == choice.message.content


def test_chat_without_max_tokens_may_fill_the_context(world):
    server, refs, _ = world
    r = refs["spm"]
    messages = [{"role": "user", "content": "hi"}]
    ids = r.tok.apply_chat_template(messages, add_generation_prompt=True)
    reply = server.client.chat.completions.create(model="spm", messages=messages, temperature=0,
                                                  extra_body={"return_token_ids": True})
    assert _ids(reply.choices[0]) == r.greedy(ids, CONTEXT - len(ids))


# ---- streaming ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["byte", "spm"])
def test_streamed_pieces_join_to_the_whole_text(world, name):
    server, refs, _ = world
    r = refs[name]
    for prompt in PROMPTS:
        whole = server.client.completions.create(model=name, prompt=prompt, max_tokens=12, temperature=0)
        chunks = list(server.client.completions.create(model=name, prompt=prompt, max_tokens=12, temperature=0,
                                                       stream=True, stream_options={"include_usage": True}))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
        assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
        assert all(c.usage is None for c in chunks[:-1])
        messages = [{"role": "user", "content": prompt}]
        whole = server.client.chat.completions.create(model=name, messages=messages, max_tokens=12, temperature=0)
        chunks = list(server.client.chat.completions.create(model=name, messages=messages, max_tokens=12,
                                                            temperature=0, stream=True))
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
        assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
        assert all(c.object == "chat.completion.chunk" for c in chunks)


def test_streaming_sends_each_token_id_once(world):
    server, refs, _ = world
    r = refs["byte"]
    chunks = list(server.client.completions.create(model="byte", prompt="Hello wörld", max_tokens=9, temperature=0,
                                                   stream=True, extra_body={"return_token_ids": True}))
    assert [t for c in chunks for t in c.choices[0].token_ids] == r.greedy(r.tok.encode("Hello wörld"), 9)


def test_a_client_that_leaves_a_stream_harms_nothing(world):
    """Its choice ends (aborted, or finished first: the driver does not wait for the client) and the
    server goes on serving."""
    server, _, _ = world
    before = _metrics(server)
    with server.client.completions.with_streaming_response.create(model="spm", prompt="Hello", max_tokens=80,
                                                                  temperature=0, stream=True) as response:
        next(response.iter_lines())                  # the first event, then the connection closes
    ended = lambda: sum(v - before.get(k, 0.0) for k, v in _metrics(server).items()
                        if k.startswith("vllm:request_success_total"))
    assert wait_for(lambda: ended() == 1)
    assert _metrics(server)["vllm:num_requests_running"] == 0
    assert server.client.completions.create(model="spm", prompt="ok", max_tokens=2).choices[0].finish_reason


# ---- fields ------------------------------------------------------------------------------------

def test_an_end_token_ends_the_choice_with_stop_and_no_text_of_it(world):
    server, refs, dirs = world
    r = refs["byte"]
    for stream in (False, True):
        reply = server.client.completions.create(model="byte", prompt=EOS_PROMPT, max_tokens=12, temperature=0,
                                                 stream=stream, extra_body={"return_token_ids": True})
        if stream:
            chunks = list(reply)
            tokens = [t for c in chunks for t in c.choices[0].token_ids]
            text, finish = "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason
        else:
            tokens, text, finish = _ids(reply.choices[0]), reply.choices[0].text, reply.choices[0].finish_reason
        assert tokens[-1] == dirs["extra_eos"] and len(tokens) >= 4 and finish == "stop"
        assert text == r.tok.decode(tokens[:-1], skip_special_tokens=True)


def test_stop_strings_cut_the_text_before_them(world):
    server, refs, _ = world
    prompt = "Hello wörld"
    pieces = [c.choices[0].text for c in server.client.completions.create(model="spm", prompt=prompt, max_tokens=30,
                                                                          temperature=0, stream=True)]
    text = "".join(pieces)
    # a stop string across two tokens' text: the stream must hold back the first one's last character
    ends = np.cumsum([len(p) for p in pieces])
    at = next(int(ends[j]) - 1 for j in range(1, len(pieces) - 1) if pieces[j] and pieces[j + 1]
              and text.find(text[ends[j] - 1:ends[j] + 1]) == ends[j] - 1 and "\ufffd" not in text[ends[j] - 1:ends[j] + 1])
    stop = text[at:at + 2]
    for stream in (False, True):
        reply = server.client.completions.create(model="spm", prompt=prompt, max_tokens=30, temperature=0,
                                                 stop=[stop, "never-made"], stream=stream)
        chunks = list(reply) if stream else [reply]
        assert "".join(c.choices[0].text for c in chunks) == text[:at]
        assert chunks[-1].choices[0].finish_reason == "stop"
    chat = server.client.chat.completions.create(model="spm", messages=[{"role": "user", "content": "x"}],
                                                 max_tokens=20, temperature=0)
    content = chat.choices[0].message.content
    cut = server.client.chat.completions.create(model="spm", messages=[{"role": "user", "content": "x"}],
                                                max_tokens=20, temperature=0, stop=content[3:5])
    assert cut.choices[0].message.content == content[:content.find(content[3:5])]
    assert cut.choices[0].finish_reason == "stop"
    unmet = server.client.completions.create(model="spm", prompt=prompt, max_tokens=30, temperature=0, stop="\x00~")
    assert unmet.choices[0].text == text


def test_the_same_seed_gives_the_same_text_whatever_else_runs(world):
    server, _, _ = world

    def sample(seed, **kw):
        return server.client.completions.create(model="byte", prompt="Hello", max_tokens=12, temperature=1.0,
                                                seed=seed, **kw).choices

    alone = sample(7)[0].text
    with concurrent.futures.ThreadPoolExecutor(6) as pool:   # beside other sampled and greedy traffic
        busy = list(pool.map(lambda s: sample(s)[0].text, [7, 8, 9, 7, 10, 7]))
    assert busy[0] == busy[3] == busy[5] == alone
    assert len({alone, busy[1], busy[2], busy[4]}) == 4
    several = sample(7, n=3)
    assert several[0].text == alone and len({c.text for c in several}) == 3


def test_generation_config_gives_the_defaults(world):
    server, refs, _ = world
    r = refs["spm"]
    greedy = r.greedy(r.tok.encode("Hello"), 10)
    ask = lambda name, **kw: _ids(server.client.completions.create(
        model=name, prompt="Hello", max_tokens=10, seed=0, extra_body=dict(kw, return_token_ids=True)).choices[0])
    assert ask("spm-top-k-1") == greedy                    # its top_k=1 under OpenAI's default temperature 1
    assert ask("spm") != greedy                             # without it: sampled
    assert ask("spm-top-k-1", top_k=-1) == ask("spm")       # a request's own field wins


def test_sampling_fields_keep_what_they_promise(world):
    server, refs, _ = world
    r = refs["byte"]
    ids = r.tok.encode("Hello")
    greedy = r.greedy(ids, 8)
    # one token left by top_k=1, by min_p=1 and by a tiny top_p: the argmax, however hot
    for extra in ({"top_k": 1}, {"min_p": 1.0}, {"top_p": 1e-9}):
        reply = server.client.completions.create(model="byte", prompt="Hello", max_tokens=8, temperature=5.0,
                                                 extra_body=dict(extra, return_token_ids=True))
        assert _ids(reply.choices[0]) == greedy, extra
    # top_k=3: every token is among the 3 most likely of its step (logprobs are the raw ones)
    reply = server.client.completions.create(model="byte", prompt="Hello", max_tokens=12, temperature=3.0, seed=1,
                                             logprobs=3, extra_body={"top_k": 3, "return_token_ids": True})
    tokens = _ids(reply.choices[0])
    lsm = r.log_softmax(ids + tokens)[len(ids) - 1:]
    for step, t in enumerate(tokens):
        assert t in np.argsort(-lsm[step])[:3], step
    assert tokens != greedy[:len(tokens)]


def test_logprobs_are_the_models_log_softmax(world):
    server, refs, _ = world
    r = refs["byte"]
    prompt = "Grüße"
    ids = r.tok.encode(prompt)
    reply = server.client.completions.create(model="byte", prompt=prompt, max_tokens=6, temperature=0, logprobs=3,
                                             echo=True, extra_body={"return_token_ids": True})
    choice = reply.choices[0]
    tokens = _ids(choice)
    lsm = r.log_softmax(ids + tokens)                  # row i: the distribution of token i + 1
    lp = choice.logprobs
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None   # the first prompt token has none
    everything = ids + tokens
    assert lp.tokens == [r.tok.decode([t]) for t in everything]
    for i in range(1, len(everything)):
        assert lp.token_logprobs[i] == pytest.approx(lsm[i - 1, everything[i]], abs=1e-4)
        top = np.argsort(-lsm[i - 1])[:3]
        want = {r.tok.decode([int(t)]): lsm[i - 1, t] for t in top}
        want.setdefault(lp.tokens[i], lsm[i - 1, everything[i]])
        assert set(lp.top_logprobs[i]) == set(want)
        for k, v in lp.top_logprobs[i].items():
            assert v == pytest.approx(want[k], abs=1e-4)
    assert choice.text == prompt + r.text(tokens)
    # sampled hot and penalized, the values stay the raw log-softmax of the logits
    hot = server.client.completions.create(model="byte", prompt=prompt, max_tokens=6, temperature=2.0, seed=3,
                                           logprobs=0, extra_body={"repetition_penalty": 1.5, "return_token_ids": True})
    tokens = _ids(hot.choices[0])
    lsm = r.log_softmax(ids + tokens)[len(ids) - 1:]
    assert hot.choices[0].logprobs.token_logprobs == pytest.approx([lsm[i, t] for i, t in enumerate(tokens)], abs=1e-4)
    # chat: logprobs with top_logprobs, each top list in order
    messages = [{"role": "user", "content": "hé"}]
    chat_ids = r.tok.apply_chat_template(messages, add_generation_prompt=True)
    chat = server.client.chat.completions.create(model="byte", messages=messages, max_tokens=5, temperature=0,
                                                 logprobs=True, top_logprobs=2, extra_body={"return_token_ids": True})
    tokens = _ids(chat.choices[0])
    lsm = r.log_softmax(chat_ids + tokens)[len(chat_ids) - 1:]
    for step, (t, entry) in enumerate(zip(tokens, chat.choices[0].logprobs.content)):
        assert entry.logprob == pytest.approx(lsm[step, t], abs=1e-4)
        assert entry.token == r.tok.decode([t]) and entry.bytes == list(entry.token.encode())
        assert [e.logprob for e in entry.top_logprobs] == pytest.approx(np.sort(lsm[step])[::-1][:2], abs=1e-4)
    # streamed: one entry per token, the same values
    chunks = list(server.client.chat.completions.create(model="byte", messages=messages, max_tokens=5, temperature=0,
                                                        logprobs=True, stream=True))
    streamed = [e.logprob for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert streamed == pytest.approx([e.logprob for e in chat.choices[0].logprobs.content], abs=1e-5)


def _penalized_greedy(r, ids, k, presence, frequency, repetition):
    """Greedy decoding over the model's logits with OpenAI's presence and frequency penalties (on
    the tokens made) and CTRL's repetition penalty (on prompt and made tokens), in numpy."""
    out = []
    for _ in range(k):
        logits = r.model(np.array([ids + out])).logits.numpy()[0, -1].astype(np.float64)
        seen = np.zeros(logits.shape, bool)
        seen[ids + out] = True
        logits = np.where(seen, np.where(logits < 0, logits * repetition, logits / repetition), logits)
        counts = np.bincount(np.array(out, np.int64), minlength=logits.size)[:logits.size]
        logits = logits - frequency * counts - presence * (counts > 0)
        out.append(int(np.argmax(logits)))
        if out[-1] in r.eos:
            break
    return out


def test_penalties_match_numpy(world):
    server, refs, _ = world
    r = refs["spm"]
    ids = r.tok.encode("Hello")
    for presence, frequency, repetition in ((0.0, 0.0, 1.8), (1.5, 0.0, 1.0), (0.0, 1.2, 1.0), (0.7, 0.5, 1.3)):
        reply = server.client.completions.create(
            model="spm", prompt="Hello", max_tokens=12, temperature=0, presence_penalty=presence,
            frequency_penalty=frequency, extra_body={"repetition_penalty": repetition, "return_token_ids": True})
        want = _penalized_greedy(r, ids, 12, presence, frequency, repetition)
        assert _ids(reply.choices[0]) == want, (presence, frequency, repetition)
    plain = r.greedy(ids, 12)
    assert len(set(plain)) < len(plain)           # unpenalized, this prompt repeats itself


def test_echo_and_n(world):
    server, refs, _ = world
    r = refs["spm"]
    reply = server.client.completions.create(model="spm", prompt="Hi there", max_tokens=4, temperature=0, n=2,
                                             echo=True)
    want = r.text(r.greedy(r.tok.encode("Hi there"), 4))
    assert [c.text for c in reply.choices] == ["Hi there" + want] * 2
    chunks = list(server.client.completions.create(model="spm", prompt="Hi there", max_tokens=4, temperature=0,
                                                   echo=True, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == "Hi there" + want
    # streamed with logprobs: the prompt's come with its text first, as the whole reply has them
    whole = server.client.completions.create(model="spm", prompt="Hi there", max_tokens=4, temperature=0, echo=True,
                                             logprobs=2, n=2).choices[0].logprobs
    chunks = list(server.client.completions.create(model="spm", prompt="Hi there", max_tokens=4, temperature=0,
                                                   echo=True, logprobs=2, n=2, stream=True))
    for index in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices[0].index == index]
        assert mine[0].text == "Hi there"
        streamed = [v for c in mine if c.logprobs for v in c.logprobs.token_logprobs]
        assert streamed[0] is None and whole.token_logprobs[0] is None
        assert streamed[1:] == pytest.approx(whole.token_logprobs[1:], abs=1e-5)   # rows' slots differ: rounding


# ---- refusals ----------------------------------------------------------------------------------

@pytest.mark.parametrize("extra, field", [
    ({"logit_bias": {"5": 1.0}}, "logit_bias"),
    ({"best_of": 3}, "best_of"),
    ({"suffix": "end"}, "suffix"),
    ({"ignore_eos": True}, "ignore_eos"),
    ({"min_tokens": 2}, "min_tokens"),
    ({"top_p": 0}, "top_p"),
    ({"temperature": -1}, "temperature"),
    ({"n": 0}, "n"),
    ({"logprobs": 21}, "logprobs"),
    ({"seed": 2 ** 63}, "seed"),
    ({"stop": ["ok", ""]}, "stop"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
])
def test_a_field_it_does_not_run_is_a_400_naming_it(world, extra, field):
    server, _, _ = world
    with pytest.raises(openai.BadRequestError) as e:
        server.client.completions.create(model="byte", prompt="x", max_tokens=2, extra_body=extra)
    assert e.value.status_code == 400 and field in e.value.message and e.value.body["param"] == field


@pytest.mark.parametrize("extra, field", [
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"top_logprobs": 2}, "top_logprobs"),          # without logprobs
    ({"echo": True}, "echo"),                       # a completions field
])
def test_a_chat_field_it_does_not_run_is_a_400_naming_it(world, extra, field):
    server, _, _ = world
    with pytest.raises(openai.BadRequestError) as e:
        server.client.chat.completions.create(model="byte", messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                              extra_body=extra)
    assert field in e.value.message


def test_an_unknown_model_is_a_404(world):
    server, _, _ = world
    with pytest.raises(openai.NotFoundError) as e:
        server.client.completions.create(model="nope", prompt="x", max_tokens=2)
    assert "nope" in e.value.message
    with pytest.raises(openai.NotFoundError):
        server.client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


def test_a_prompt_longer_than_the_context_is_a_400(world):
    server, refs, _ = world
    long_prompt = "Hello wörld " * 40
    assert len(refs["byte"].tok.encode(long_prompt)) > CONTEXT
    with pytest.raises(openai.BadRequestError) as e:
        server.client.completions.create(model="byte", prompt=long_prompt, max_tokens=2)
    assert f"maximum context length is {CONTEXT}" in e.value.message
    with pytest.raises(openai.BadRequestError):
        server.client.chat.completions.create(model="byte", messages=[{"role": "user", "content": long_prompt}])
    with pytest.raises(openai.BadRequestError) as e:                          # fits, but not with the completion
        server.client.completions.create(model="byte", prompt="Hello", max_tokens=CONTEXT)
    assert e.value.body["param"] == "max_tokens"


@pytest.mark.parametrize("body, message", [
    (b"{not json", "not valid JSON"),
    (b"[" * 5000, "not valid JSON"),                                          # RecursionError in the parser
    (b'{"model": "byte", "prompt": "x", "max_tokens": 1' + b"0" * 5000 + b"}", "not valid JSON"),   # past 4300 digits
    (b"\xff\xfe\x00", "not valid JSON"),
    ({"model": ["byte"], "prompt": "x"}, "model must be a string"),          # unhashable
    ({"model": "byte", "prompt": [1, 2 ** 64]}, "token ids must be in [0, 406), got 18446744073709551616"),
    ({"model": "byte", "prompt": [1, 2 ** 63]}, "token ids must be in"),
    ({"model": "byte", "prompt": [1, -1]}, "token ids must be in"),
    ({"model": "byte", "prompt": "\ud800"}, "lone surrogate"),
    ({"model": "byte", "prompt": [[[[[[[[1]]]]]]]]}, "prompt must be"),       # deeply nested inside a field
    ({"model": "byte", "prompt": "x", "stop": [[[[[[["a"]]]]]]]}, "stop must be"),
    ({"model": "byte", "prompt": "x", "temperature": float("nan")}, "temperature must be a finite number"),
    ({"model": "byte", "prompt": "x", "stream": "yes"}, "stream must be true or false"),
    ({"model": "byte", "prompt": []}, "prompt must be"),
    ({"model": "byte"}, "prompt is required"),
    ([1, 2], "must be a JSON object"),
])
def test_malformed_bodies_are_a_400_never_a_500(world, body, message):
    server, _, _ = world
    if not isinstance(body, bytes):
        body = json.dumps(body).encode()
    status, text = server.post("/v1/completions", body)
    assert status == 400 and message in json.loads(text)["error"]["message"], text
    assert server.client.completions.create(model="spm", prompt="ok", max_tokens=1).choices[0].finish_reason


def test_malformed_chat_messages_are_a_400(world):
    server, _, _ = world
    for messages, message in (([], "non-empty list"), ([{"role": "robot", "content": "x"}], "role must be"),
                              ([{"role": "user"}], "content is required"),
                              ([{"role": "user", "content": "x", "name": "me"}], "messages[0].name"),
                              ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "only text"),
                              ([{"role": "user", "content": "x"}] * 2 + [[]], "must be an object")):
        status, text = server.post("/v1/chat/completions", {"model": "byte", "messages": messages})
        assert status == 400 and message in json.loads(text)["error"]["message"], (messages, text)


# ---- metrics -----------------------------------------------------------------------------------

def _metrics(server):
    status, text = server.get("/metrics")
    assert status == 200
    values = {}
    for family in prom_parser.text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("model_name") == "spm":
                key = s.name + "".join(f",{k}={v}" for k, v in sorted(s.labels.items()) if k in ("finished_reason",))
                if s.name.endswith("_bucket"):
                    continue
                values[key] = s.value
    return values


def test_metrics_count_requests_and_tokens(world):
    server, _, _ = world
    before = _metrics(server)
    reply = server.client.completions.create(model="spm", prompt="Hello wörld", max_tokens=7, temperature=0)
    after = _metrics(server)
    done = reply.usage.completion_tokens
    delta = lambda k: after.get(k, 0.0) - before.get(k, 0.0)
    assert delta("vllm:prompt_tokens_total") == reply.usage.prompt_tokens
    assert delta("vllm:generation_tokens_total") == done
    assert delta(f"vllm:request_success_total,finished_reason={reply.choices[0].finish_reason}") == 1
    assert delta("vllm:time_to_first_token_seconds_count") == 1
    assert delta("vllm:inter_token_latency_seconds_count") == done - 1
    assert delta("vllm:e2e_request_latency_seconds_count") == 1
    assert after["vllm:num_requests_running"] == 0 and after["vllm:num_requests_waiting"] == 0


# ---- the command line --------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    ([], "no model to serve"),
    (["DIR", "--mesh", "tp=x"], "the size of tp must be a positive integer"),
    (["DIR", "--mesh", "xp=2"], "DIM one of dp, tp, pp, ulysses, ring"),
    (["DIR", "--mesh", "tp=2,tp=2"], "tp is given twice"),
    (["DIR", "--devices", "0,a"], "device ids must be non-negative integers"),
    (["DIR", "--model", "b=DIR2", "--devices", "DIR=0", "--devices", "b=0"], "device 0 is already another model's"),
    (["DIR", "--model", "DIR=DIR2"], "given to two models"),
    (["DIR", "--mesh", "tp=2", "--devices", "0"], "too few devices"),
])
def test_a_bad_command_line_is_a_clear_error(args, message):
    script = os.path.join(os.path.dirname(sys.executable), "dtorch-serve")
    done = subprocess.run([script, *args], capture_output=True, text=True, timeout=PATIENCE_S)
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_a_missing_model_directory_is_a_clear_error(tmp_path):
    done = subprocess.run([sys.executable, "-m", "dtorch.serve", str(tmp_path / "none")], capture_output=True,
                          text=True, timeout=PATIENCE_S)
    assert done.returncode == 1 and "dtorch-serve: error:" in done.stderr and "none" in done.stderr
    assert "Traceback" not in done.stderr


# ---- failures and stopping (process workers) ---------------------------------------------------

def test_a_dead_device_fails_its_model_only_and_sigterm_drains(world):
    _, refs, dirs = world
    server = ServerProcess([dirs["byte"], "--served-model-name", "a", "--model", f"b={dirs['spm']}",
                            "--workers", "process", "--max-model-len", str(CONTEXT)])
    try:
        assert wait_for(lambda: len(worker_pids(server.proc.pid)) == 2)
        assert server.client.completions.create(model="a", prompt="x", max_tokens=2, temperature=0).choices
        os.kill(worker_pids(server.proc.pid)[0], signal.SIGKILL)             # model a's only device
        assert wait_for(lambda: server.get("/health")[0] == 503)
        status, text = server.get("/health")
        assert "'a'" in json.loads(text)["error"]["message"] and "'b'" not in json.loads(text)["error"]["message"]
        with pytest.raises(openai.APIStatusError) as e:
            server.client.completions.create(model="a", prompt="x", max_tokens=2)
        assert e.value.status_code == 503 and "'a'" in e.value.message
        r = refs["spm"]
        reply = server.client.completions.create(model="b", prompt="Hello wörld", max_tokens=6, temperature=0,
                                                 extra_body={"return_token_ids": True})
        assert _ids(reply.choices[0]) == r.greedy(r.tok.encode("Hello wörld"), 6)
        # SIGTERM while a stream runs: it is finished, then the server exits by itself
        stream = server.client.completions.create(model="b", prompt="Hello", max_tokens=40, temperature=0, stream=True,
                                                  extra_body={"return_token_ids": True})
        chunks = [next(iter(stream))]
        server.proc.send_signal(signal.SIGTERM)
        chunks += list(stream)
        assert [t for c in chunks for t in c.choices[0].token_ids] == r.greedy(r.tok.encode("Hello"), 40)
        assert server.proc.wait(PATIENCE_S) == 0
    finally:
        server.stop()
