"""What the one decision reads of this machine for a load: the free memory, the machine profile, the model's
recorded routing and the RPC devices, each only where a decision first needs it (a model that fits never measures
a profile; the devices are measured only where a split is planned). The profile and the devices are measured once
a load; the free memory and the routing once a decision (decide() calls each source at most once)."""

from __future__ import annotations

from typing import Callable, Optional

from hypura.plan.auto import Fit
from hypura.plan.decision import Routing


class Measured:
    """This machine as decide() reads it: bound methods passed as its sources (hypura.plan.decision)."""

    def __init__(self, path: str, header, rpc: tuple[str, ...], fit: Fit, profile: object = None,
                 say: Optional[Callable[[str], None]] = None):
        """rpc: the RPC servers registered (runtime/device_list.py); fit.free and `profile`, where given, stand for
        the measured ones; say: where a profile's measuring says what it does."""
        self.path, self.header, self.rpc, self.fit, self.say = path, header, rpc, fit, say
        self._profile, self._devices = profile, None

    def free(self):
        from hypura.profile.free import free_memory

        return self.fit.free or free_memory()

    def profile(self):
        """The machine profile, read (or measured) once, when first asked."""
        from hypura.profile.measure import planning_profile

        if not self._profile:
            self._profile = planning_profile(self.path, self.say, measure=self.fit.measure_profile)
        return self._profile

    def routing(self) -> Routing:
        from hypura.runtime.moe.coactivation import routing_frequencies

        return Routing(*routing_frequencies(self.header))

    def devices(self):
        from hypura.runtime.device_list import measure

        if self._devices is None:
            self._devices = measure(self.rpc)
        return self._devices
