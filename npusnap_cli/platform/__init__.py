"""Adapters to what runs outside Python: CRIU, the injected agent, the CUDA driver, the npusim
daemon, /proc. They know nothing of the pipelines or the backends above them."""
