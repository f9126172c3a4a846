"""`hypura-cli`'s generation loop: llama-completion's main loop (tools/completion/completion.cpp),
ported statement by statement so that the same flags print the same bytes.

One-shot: echo the prompt (unless --no-display-prompt), stream sampled tokens until -n tokens,
an end-of-generation token (" [end of text]"), a reverse prompt or a full context; then "\\n\\n".
Interactive (-i, -if, conversation mode): after each answer read a line from stdin (EOF ends the
session with "EOF by user"); Ctrl-C while generating hands control back, Ctrl-C while waiting
for input exits with status 130. Not ported: prompt cache files, group attention (self-extend),
grammars, encoder-decoder models.
"""

from __future__ import annotations

import os
import signal
from dataclasses import replace

from hypura.cli.completion.console import PROMPT, RESET, USER_INPUT, Console
from hypura.cli.completion.chat import BuiltinChatTemplate
from hypura.bindings.vocab import Vocab
from hypura.cli.completion.common_init import load_model
from hypura.cli.completion.sampling import CommonSampler, sampling_from_model
from hypura.cli.completion.arg_values import process_escapes
from hypura.cli.completion.perf import print_perf
from hypura.cli.completion.common_params import Settings
from hypura.cli.completion.speculative import speculation
from hypura.speculative.auto_draft import resolve
from hypura.errors import HypuraError

import llama_cpp  # noqa: E402  (imported after hypura's engine: our library)

FN = "llama_completion"  # the tool whose log lines we reproduce


def _decode(llm, tokens: list[int]) -> bool:
    """common_batch_get_one + llama_process(DECODE): positions follow the memory, logits for
    the last token only; timed for --stats, and a failure to stream weights raises."""
    return llm.decode_tokens(tokens)


class _Interrupted(BaseException):
    """Ctrl-C that ends the run (a BaseException: nothing on the way may swallow it)."""


class Completion:
    def __init__(self, s: Settings, model_path: str, con: Console):
        self.s, self.con = s, con
        self.is_interacting = False
        self.need_insert_eot = False
        self.interactive = s.interactive
        self.llm = self.sampler = self.spec = None
        self.model_path = model_path

    # --- setup (llama_completion() up to the main loop) ------------------------------------------
    def run(self) -> int:
        s, con = self.s, self.con
        n_ctx_req = s.n_ctx
        if n_ctx_req != 0 and n_ctx_req < 8:
            con.wrn(f"{FN}: warning: minimum context size is 8, using minimum size.\n")
            s = self.s = replace(s, n_ctx=8)
        con.inf(f"{FN}: llama backend init\n")
        con.inf(f"{FN}: load the model and apply lora adapter, if any\n")
        self.llm = llm = load_model(s, self.model_path, say=lambda line: con.inf(line + "\n"))
        ctx, model = llm.ctx, llm.model.model
        if llama_cpp.llama_model_has_encoder(model):
            raise HypuraError("encoder-decoder models are not supported by hypura-cli")
        self.vocab = vocab = llm.vocab
        self.sampler = CommonSampler(vocab, sampling_from_model(model, s.sampling), llama_cpp.llama_n_ctx(ctx))
        self.ctx_shift = s.ctx_shift
        if self.ctx_shift and not llm.context.can_shift():
            con.wrn("KV cache shifting is not supported for this context, disabling KV cache shifting\n")
            self.ctx_shift = False
        if s.warmup:
            self._warmup(ctx, vocab)
        self.tmpl = BuiltinChatTemplate(model, s.chat_template)
        llama_cpp.llama_perf_context_reset(ctx)

        n_ctx_train = llama_cpp.llama_model_n_ctx_train(model)
        self.n_ctx = n_ctx = llama_cpp.llama_n_ctx(ctx)
        if n_ctx > n_ctx_train:
            con.wrn(f"{FN}: model was trained on only {n_ctx_train} context tokens ({n_ctx} specified)\n")

        conversation = s.conversation
        if conversation is None:
            conversation = self.tmpl.has_explicit_template
            if conversation:
                con.inf(f"{FN}: chat template is available, enabling conversation mode (disable it with -no-cnv)\n")
        if conversation and not self.tmpl.has_explicit_template:
            con.wrn(f"{FN}: chat template is not available or is not supported. This may cause the model "
                    "to output suboptimal responses\n")
        if conversation:
            if s.enable_chat_template:
                if s.prompt and not s.system_prompt:
                    con.wrn("*** User-specified prompt will pre-start conversation, did you mean to set "
                            "--system-prompt (-sys) instead?\n")
                con.inf(f"{FN}: chat template example:\n{self.tmpl.example().decode('utf-8', 'replace')}\n")
            else:
                con.inf(f"{FN}: in-suffix/prefix is specified, chat template will be disabled\n")
        self.conversation = conversation
        con.inf("\n")
        # as llama.cpp's common_params_get_system_info(): the thread counts Hypura chose show here
        con.inf(f"system_info: n_threads = {llm.n_threads} (n_threads_batch = {llm.n_threads_batch}) / "
                f"{os.cpu_count()} | {llama_cpp.llama_print_system_info().decode()}\n")
        con.inf("\n")

        self.chat_msgs: list[tuple[bytes, bytes]] = []
        add_bos = vocab.add_bos  # && !use_jinja: llama-completion's default is no jinja
        self.waiting_for_first_input = False
        prompt = b""
        if conversation and s.enable_chat_template:
            if s.system_prompt:
                self._chat_add_and_format(b"system", s.system_prompt)
            if s.prompt:
                self._chat_add_and_format(b"user", s.prompt)
            else:
                self.waiting_for_first_input = True
            if s.system_prompt or s.prompt:
                prompt = self.tmpl.apply(self.chat_msgs, add_generation_prompt=bool(s.prompt))
        else:
            prompt = s.prompt
        self.prompt = prompt
        embd_inp = vocab.tokenize(prompt, True, True)
        con.dbg(f'prompt: "{prompt.decode("utf-8", "replace")}"\n')

        if not self.waiting_for_first_input and not embd_inp:
            if add_bos:
                embd_inp.append(vocab.bos)
                con.wrn(f"embd_inp was considered empty and bos was added: {embd_inp}\n")
            else:
                con.err("input is empty\n")
                return 255  # llama-completion returns -1
        if len(embd_inp) > n_ctx - 4:
            con.err(f"{FN}: prompt is too long ({len(embd_inp)} tokens, max {n_ctx - 4})\n")
            return 1

        self.n_keep = s.n_keep
        if self.n_keep < 0 or self.n_keep > len(embd_inp):
            self.n_keep = len(embd_inp)
        else:
            self.n_keep += int(add_bos)

        self.interactive_first = s.interactive_first
        if conversation:
            if s.single_turn and s.prompt:
                self.interactive = self.interactive_first = False
            else:
                self.interactive_first = True
        if self.interactive_first:
            self.interactive = True
        spec = resolve(s.speculative, self.llm)  # auto: the draft found, n-gram drafting where it pays, or none
        if spec is not None and not (self.interactive and s.speculative.type == "auto"):
            self.spec = speculation(spec, self.llm, self.vocab, self.sampler, self.interactive, con)

        if s.verbose_prompt:
            con.inf(f"{FN}: prompt: '{s.prompt.decode('utf-8', 'replace')}'\n")
            con.inf(f"{FN}: number of tokens in prompt = {len(embd_inp)}\n")
            for t in embd_inp:
                con.inf(f"{t:6d} -> '{vocab.piece(t).decode('utf-8', 'replace')}'\n")
            con.inf("\n")

        signal.signal(signal.SIGINT, self._sigint)
        self._print_generation_info(embd_inp)
        try:
            return self._loop(embd_inp)
        except _Interrupted:
            con.set_display(RESET)
            con.write(b"\n")
            self.print_perf()
            con.write(b"Interrupted by user\n")
            return 130

    def _warmup(self, ctx, vocab: Vocab) -> None:
        """common_init_from_params' warmup: decode BOS+EOS once, then forget it."""
        con = self.con
        con.log(4, "warming up the model with an empty run - please wait ... (--no-warmup to disable)\n")
        tmp = [t for t in (vocab.bos, llama_cpp.llama_vocab_eos(vocab.vocab)) if t != llama_cpp.LLAMA_TOKEN_NULL]
        tmp = (tmp or [0])[: self.s.n_batch]
        _decode(self.llm, tmp)
        self.llm.context.clear()
        llama_cpp.llama_synchronize(ctx)
        llama_cpp.llama_perf_context_reset(ctx)
        self.llm.stats(reset=True)
        self.sampler.reset()

    def _chat_add_and_format(self, role: bytes, content: bytes) -> bytes:
        formatted = self.tmpl.format_single(self.chat_msgs, (role, content), role == b"user")
        self.chat_msgs.append((role, content))
        return formatted

    def _print_generation_info(self, embd_inp) -> None:
        s, con, sp = self.s, self.con, self.sampler.params
        if self.interactive:
            con.inf(f"{FN}: interactive mode on.\n")
            for ap in s.antiprompt:
                con.inf(f"Reverse prompt: '{ap.decode('utf-8', 'replace')}'\n")
            if s.input_prefix_bos:
                con.inf("Input prefix with BOS\n")
            if s.input_prefix:
                con.inf(f"Input prefix: '{s.input_prefix.decode('utf-8', 'replace')}'\n")
            if s.input_suffix:
                con.inf(f"Input suffix: '{s.input_suffix.decode('utf-8', 'replace')}'\n")
        con.inf(f"sampler seed: {self.sampler.seed()}\n")
        con.inf("sampler params: \n"
                f"\trepeat_last_n = {sp['penalty_last_n']}, repeat_penalty = {sp['penalty_repeat']:.3f}, "
                f"frequency_penalty = {sp['penalty_freq']:.3f}, presence_penalty = {sp['penalty_present']:.3f}\n"
                f"\tdry_multiplier = {sp['dry_multiplier']:.3f}, dry_base = {sp['dry_base']:.3f}, "
                f"dry_allowed_length = {sp['dry_allowed_length']}, dry_penalty_last_n = {sp['dry_penalty_last_n']}\n"
                f"\ttop_k = {sp['top_k']}, top_p = {sp['top_p']:.3f}, min_p = {sp['min_p']:.3f}, "
                f"xtc_probability = {sp['xtc_probability']:.3f}, xtc_threshold = {sp['xtc_threshold']:.3f}, "
                f"typical_p = {sp['typ_p']:.3f}, top_n_sigma = {sp['top_n_sigma']:.3f}, temp = {sp['temp']:.3f}\n"
                f"\tmirostat = {sp['mirostat']}, mirostat_lr = {sp['mirostat_eta']:.3f}, "
                f"mirostat_ent = {sp['mirostat_tau']:.3f}\n")
        chain = self.sampler.chain
        names = [llama_cpp.llama_sampler_name(llama_cpp.llama_sampler_chain_get(chain, i)).decode()
                 for i in range(llama_cpp.llama_sampler_chain_n(chain))]
        con.inf(f"sampler chain: logits -> {' -> '.join(names)} \n")
        con.inf(f"generate: n_ctx = {self.n_ctx}, n_batch = {s.n_batch}, n_predict = {s.n_predict}, "
                f"n_keep = {self.n_keep}\n")
        con.inf("\n")
        if self.interactive:
            if s.multiline_input:
                control = (" - To return control to the AI, end your input with '\\'.\n"
                           " - To return control without starting a new line, end your input with '/'.\n")
            else:
                control = (" - Press Return to return control to the AI.\n"
                           " - To return control without starting a new line, end your input with '/'.\n"
                           " - If you want to submit another line, end your input with '\\'.\n")
            con.inf("== Running in interactive mode. ==\n")
            con.inf(" - Press Ctrl+C to interject at any time.\n")
            con.inf(control)
            if self.conversation and s.enable_chat_template and not s.system_prompt:
                con.inf(" - Not using system message. To change it, set a different value via -sys PROMPT\n")
            con.inf("\n")
            self.is_interacting = self.interactive_first

    def _sigint(self, signo, frame) -> None:
        """completion.cpp's sigint_handler: the first Ctrl-C of a generation in interactive mode
        hands control to the user; any other ends the run (status 130). Ending raises, rather than
        printing here, so that no buffered write is re-entered from the handler."""
        if not self.is_interacting and self.interactive:
            self.is_interacting = True
            self.need_insert_eot = True
            return
        raise _Interrupted

    # --- the main loop -----------------------------------------------------------------------------
    def _loop(self, embd_inp: list[int]) -> int:
        s, con, vocab, smpl = self.s, self.con, self.vocab, self.sampler
        ctx, kv = self.llm.ctx, self.llm.context
        n_ctx = self.n_ctx
        # llama.cpp caps a context's batch at the requested n_ctx, which it then pads: with -c 12 a
        # 13-token prompt aborts llama-completion (GGML_ABORT in get_sub_batch); we feed smaller chunks
        n_batch = min(s.n_batch, llama_cpp.llama_n_batch(ctx))
        is_antiprompt = False
        input_echo = True
        n_past = 0
        n_remain = s.n_predict
        n_consumed = 0
        assistant_ss = b""
        antiprompt_token = [ids[0] for ids in (vocab.tokenize(ap, False, True) for ap in s.antiprompt) if len(ids) == 1]
        con.set_display(PROMPT)
        display = s.display_prompt
        embd: list[int] = []

        while (n_remain != 0 and not is_antiprompt) or self.interactive:
            if embd:
                max_embd_size = n_ctx - 4
                if len(embd) > max_embd_size:
                    skipped = len(embd) - max_embd_size
                    del embd[max_embd_size:]
                    con.wrn(f"<<input too long: skipped {skipped} token{'s' if skipped != 1 else ''}>>")
                if n_past + len(embd) >= n_ctx:
                    if not self.ctx_shift:
                        con.wrn(f"\n\n{FN}: context full and context shift is disabled => stopping\n")
                        break
                    if s.n_predict == -2:
                        con.wrn(f"\n\n{FN}: context full and n_predict == {s.n_predict} => stopping\n")
                        break
                    n_left = n_past - self.n_keep
                    n_discard = n_left // 2
                    kv.seq_rm(0, self.n_keep, self.n_keep + n_discard)
                    kv.seq_add(0, self.n_keep + n_discard, n_past, -n_discard)
                    n_past -= n_discard
                    if self.spec is not None:
                        self.spec.forget(self.n_keep, n_discard)
                if self.spec is not None:  # a generated token's decode is a verification pass
                    n_done = self.spec.decode(embd, n_past, len(embd_inp) <= n_consumed and not self.is_interacting,
                                              n_remain)
                else:
                    n_done = len(embd) if _decode(self.llm, embd) else -1
                if n_done < 0:
                    con.err("failed to eval\n")
                    return 1
                n_past += n_done
            embd = []

            if len(embd_inp) <= n_consumed and not self.is_interacting:
                if self.spec is not None and self.spec.pending:
                    tok = self.spec.take()  # sampled and accepted by the verification pass
                    smpl.remember(tok)
                else:
                    tok = smpl.sample(ctx)
                    smpl.accept(tok)
                embd.append(tok)
                if self.conversation and not self.waiting_for_first_input and not vocab.is_eog(tok):
                    assistant_ss += vocab.piece(tok, False)
                input_echo = True
                n_remain -= 1
            else:
                while len(embd_inp) > n_consumed:
                    embd.append(embd_inp[n_consumed])
                    smpl.accept(embd_inp[n_consumed])  # prompt tokens count for repetition penalties
                    n_consumed += 1
                    if len(embd) == n_batch:
                        break

            if input_echo and display:
                con.write(b"".join(vocab.piece(t, s.special) for t in embd))
            if input_echo and len(embd_inp) == n_consumed:
                con.set_display(RESET)
                display = True

            if len(embd_inp) <= n_consumed:
                if s.antiprompt:
                    last_output = smpl.prev_str(32)
                    is_antiprompt = False
                    for ap in s.antiprompt:
                        extra = 0 if self.interactive else 2
                        start = len(last_output) - (len(ap) + extra) if len(last_output) > len(ap) + extra else 0
                        if last_output.find(ap, start) != -1:
                            if self.interactive:
                                self.is_interacting = True
                            is_antiprompt = True
                            break
                    if last_output and smpl.last() in antiprompt_token:
                        if self.interactive:
                            self.is_interacting = True
                        is_antiprompt = True

                if not self.waiting_for_first_input and vocab.is_eog(smpl.last()):
                    if self.interactive:
                        if s.antiprompt:
                            embd_inp += vocab.tokenize(s.antiprompt[0], False, True)
                            is_antiprompt = True
                        if s.enable_chat_template:
                            self._chat_add_and_format(b"assistant", assistant_ss)
                        self.is_interacting = True
                        con.write(b"\n")

                if self.conversation and not self.waiting_for_first_input and self.prompt:
                    self.prompt = b""
                    self.is_interacting = False

                if (n_past > 0 or self.waiting_for_first_input) and self.is_interacting:
                    if self.conversation:
                        con.write(b"\n> ")
                    if s.input_prefix_bos:
                        embd_inp.append(vocab.bos)
                    if s.input_prefix and not self.conversation:
                        con.write(s.input_prefix)
                    con.set_display(USER_INPUT)
                    display = s.display_prompt
                    buffer, another = b"", True
                    while another:
                        line, another = con.readline(s.multiline_input)
                        buffer += line
                    con.set_display(RESET)
                    display = True
                    if not buffer:  # EOF (Ctrl-D on an empty line)
                        con.write(b"EOF by user\n")
                        break
                    if buffer.endswith(b"\n"):
                        buffer = buffer[:-1]
                    if buffer:  # an empty line passes control back
                        if s.input_suffix and not self.conversation:
                            con.write(s.input_suffix)
                        if s.escape:
                            buffer = process_escapes(buffer)
                        format_chat = self.conversation and s.enable_chat_template
                        user_inp = self._chat_add_and_format(b"user", buffer) if format_chat else buffer
                        line_pfx = vocab.tokenize(s.input_prefix, False, True)
                        line_inp = vocab.tokenize(user_inp, False, format_chat)
                        line_sfx = vocab.tokenize(s.input_suffix, False, True)
                        if self.need_insert_eot and format_chat:
                            embd_inp.append(vocab.eot_or_eos())
                            self.need_insert_eot = False
                        embd_inp += line_pfx + line_inp + line_sfx
                        assistant_ss = b""
                        n_remain -= len(line_inp)
                    input_echo = False

                if n_past > 0 or self.waiting_for_first_input:
                    if self.is_interacting:
                        smpl.reset()
                    self.is_interacting = False
                    if self.waiting_for_first_input and s.single_turn:
                        self.interactive = self.interactive_first = False
                    self.waiting_for_first_input = False

            if embd and vocab.is_eog(embd[-1]) and not self.interactive:
                con.write(b" [end of text]\n")
                break

            if self.interactive and n_remain <= 0 and s.n_predict >= 0:
                n_remain = s.n_predict
                self.is_interacting = True

        con.write(b"\n\n")
        self.print_perf()
        return 0

    def print_perf(self) -> None:
        if self.llm is not None and self.sampler is not None:
            print_perf(self.con, self.llm, self.sampler.chain, self.s, self.model_path)
        if self.spec is not None and self.s.stats:
            self.con.stderr.write("\n".join("hypura: " + line for line in self.spec.describe()) + "\n")
            self.con.stderr.flush()

    def close(self) -> None:
        if self.spec is not None:
            self.spec.close()
        if self.sampler is not None:
            self.sampler.close()
        if self.llm is not None:
            self.llm.close()

