from tests.integration.netlock_support import iptables, peer  # noqa: F401  (fixture re-export)
