"""`hypura-cli`: a drop-in for llama.cpp's `llama-completion` (and `llama-cli` in scripts).

Same flags, defaults, stdout/stderr split and exit codes as the vendored llama-completion, so a
script keeps working when `llama-completion` (or `llama-cli`) becomes `hypura-cli`; the model is
loaded through `hypura.loaded.load`. Each file is named after the llama.cpp part it mirrors:

  arg.py, arg_values.py, arg_params.py   common/arg.cpp: the flag table, argv checks and value parsers,
                                         flags -> common_params
  common_params.py                       common/common.h's common_params (Settings) and sampling params
  common_init.py                         common/common.cpp's common_init_from_params: model and context
  sampling.py                            common/sampling.cpp's common_sampler over hypura.engine.Sampler
  chat.py                                common/chat.cpp without --jinja: libllama's built-in templates
  console.py                             common/console.cpp and common/log.cpp
  perf.py                                common_perf_print, llama.cpp's log routing and --stats
  speculative.py                         common/speculative.cpp: the --spec-* flags and the SpecDecoder
  device_flags.py                        common/arg.cpp's device flags (--rpc, -dev, -sm, -ts, -mg), --rpc-mem
  completion.py                          tools/completion/completion.cpp: the generation loop
"""

from __future__ import annotations

import os
import signal
import sys

from hypura.cli.completion.arg import parse
from hypura.cli.completion.arg_values import ArgvError
from hypura.errors import HypuraError


def main(argv=None) -> None:
    """Entry point: exit status 0, 1 on errors (llama.cpp's), 130 on Ctrl-C."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `hypura-cli ... | head` ends quietly, like the C tool
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C kills it until the loop installs its handler
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        settings = parse(argv)
        sys.exit(run(settings))
    except ArgvError as e:
        print(str(e), file=sys.stderr)
        sys.exit(1)
    except (HypuraError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:  # before the generation loop installs llama-completion's handler
        sys.stderr.write("Interrupted by user\n")
        os._exit(130)
    except Exception as e:  # noqa: BLE001 - a drop-in for a C tool prints one line, never a traceback
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)


def run(settings) -> int:
    """Load the model (hypura.loaded.load) and run llama-completion's loop; the exit status."""
    from hypura.cli.completion.console import Console

    con = Console(verbosity=settings.verbosity, log_disable=settings.log_disable, color=settings.color,
                  simple_io=settings.simple_io)
    model_path = settings.model
    if model_path is None:
        from hypura.models import default_model_path

        model_path = default_model_path()
    else:  # a path, or a model name in Ollama's store, LM Studio's or $HYPURA_MODELS
        from hypura.store import resolve_path

        model_path = resolve_path(str(model_path))
    from hypura.modelfile import read_header

    read_header(model_path)  # a bad file fails here, in one line, before llama.cpp is loaded
    from hypura.cli.completion.completion import Completion  # loads our libllama
    from hypura.cli.completion.perf import route_llama_logs

    route_llama_logs(con)
    completion = Completion(settings, str(model_path), con)
    try:
        return completion.run()
    finally:
        completion.close()
