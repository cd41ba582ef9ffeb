"""Per-bucket operation counters, in a module of their own so the compiled SET handler
(server/_speedups.c, configured by kv.py) can be told their class without importing the server."""


class Counters:
    """Per-bucket operation counters for `stats` (memcached's names)."""

    __slots__ = ("cmd_get", "get_hits", "get_misses", "cmd_set", "cmd_delete")

    def __init__(self):
        self.cmd_get = self.get_hits = self.get_misses = self.cmd_set = self.cmd_delete = 0

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}
