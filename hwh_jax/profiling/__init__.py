"""What a program does on its devices: kernel times from a profiler trace (``profile``), what its
HLO moves and sends (``hlo``), and the host's garbage collector beside a step loop (``host_gc``)."""
