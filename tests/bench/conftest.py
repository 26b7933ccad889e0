from services import *  # noqa: F403 - loopback services; a missing program skips the test
