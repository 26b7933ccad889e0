from services import Etcd, etcd, service_dir, services  # noqa: F401 - the real etcd on loopback
