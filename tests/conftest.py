"""Settings shared by every test process.

Hypothesis's default 200 ms deadline per example is a timing threshold: on a loaded 2-core machine a
slow example fails a test whose property holds. Timing is measured by the benches, never asserted
here, so every property test runs without a deadline (and without the too-slow health check).
"""

from hypothesis import HealthCheck, settings

settings.register_profile("sluice", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("sluice")
