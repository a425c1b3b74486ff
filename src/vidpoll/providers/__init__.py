"""Providers: one folder each (`vidpoll/providers/<name>/`), found by name at run time.

The core (worker, submitter, deliveries, store) imports only `vidpoll.providers.base`; a
provider's own modules are imported when an account names it (see `registry.load`).
"""
