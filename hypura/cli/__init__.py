"""Command-line front ends: `hypura` (Hypura's own subcommands) and `hypura-cli` (llama-cli drop-in).

    main.py          `hypura`: the subcommands, each module imported only when it runs
    errors.py        Hypura's errors as llama-cli-style failures: one line, non-zero exit
    profile_cmd.py   `hypura profile`: measure this machine, or show the cached measurement
    inspect_cmd.py   `hypura inspect MODEL`: the placement plan, from the GGUF header only
    plan_plot.py     `inspect --plot`: placement by layer and tier as a PNG
    list_cmd.py      `hypura list`: the models in the stores; with --plan, what Hypura would do with each
    bench_cmd.py     `hypura bench`'s flags (the measuring is hypura.speed)
    routing_cmd.py   `hypura routing MODEL`: a MoE model's recorded expert routing
    serve_cmd.py     `hypura serve`: its flags, then hypura.serve's server
    spec_flags.py    llama-server's speculative decoding flags, shared by serve and bench
    completion/      `hypura-cli`, one file per llama.cpp part it mirrors

`hypura synth` is hypura.synth.command.
"""
