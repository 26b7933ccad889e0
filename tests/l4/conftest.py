from services import *  # noqa: F403 - the service fixtures (mooncake_master, lmcache_server, ...)
