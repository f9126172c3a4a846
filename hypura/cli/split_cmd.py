"""`hypura inspect --split` / `--rpc`: the layers split over every device and the host (hypura.plan.shares)."""

from __future__ import annotations

import click

from hypura.plan import knobs
from hypura.plan.shares import Host, describe_shares, device_tiers, plan_shares
from hypura.sizes import parse_size
from hypura.units import model_units


def _sizes(text: str | None) -> list[int] | None:
    return [parse_size(s) for s in text.split(",")] if text else None


def show_split(header, profile, *, rpc: str | None, rpc_mem: str | None, gpu_mem: str | None, ram: str | None,
               n_ctx: int, n_ubatch: int, disk: bool, this_machine: bool) -> None:
    """Register and measure the RPC servers (this machine only), plan the split, print each device's share."""
    measured = ()
    if rpc:
        from hypura.profile.rpc import add_servers, measure_device

        measured = tuple(measure_device(name) for name in add_servers(rpc))
        for r in measured:
            click.echo(f"rpc      {r.name} at {r.endpoint}: {r.mem_free / 2**30:.1f} of {r.mem_total / 2**30:.1f} GiB "
                       f"free, link {r.link_bw / 1e9:.2f} GB/s, round trip {r.latency_s * 1e3:.2f} ms")
    gpus = _sizes(gpu_mem)
    if gpus is not None and len(gpus) == 1:
        gpus = gpus * len(profile.gpus)  # one size: each GPU held to it
    if ram is not None:
        host_ram = parse_size(ram)
    elif this_machine:
        from hypura.profile.free import free_memory

        host_ram = max(0, free_memory().ram - knobs.RAM_MARGIN)
    else:
        host_ram = max(0, profile.host.ram_available - knobs.RAM_MARGIN)
    tiers = device_tiers(profile, measured, gpu_mem=gpus, rpc_mem=_sizes(rpc_mem))
    shares = plan_shares(model_units(header), tiers, Host(host_ram, profile.cpu.decode_bw, profile.disk.read_bw, disk),
                         n_ctx=n_ctx, n_ubatch=n_ubatch, model=header.path.name)
    click.echo(f"split    {header.path.name} over {len(tiers)} device(s) and the host, -c {n_ctx}")
    for line in describe_shares(shares):
        click.echo(line)
