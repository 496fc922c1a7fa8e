"""What the two-cluster tests read back: each cluster's run Pods, and where every run went."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from runplane.basics.settings import Settings
from tests.support.kubernetes_cluster import ControlPlane

MANAGED = "app.kubernetes.io/managed-by=runplane"


@dataclass
class TwoClusters:
    """East and west, two real API servers, with their run Pods in ``namespace``."""

    settings: Settings
    east: ControlPlane
    west: ControlPlane
    namespace: str

    def pods(self, plane: ControlPlane) -> list[str]:
        """The names of the run Pods on ``plane``."""
        rest = plane.rest()
        try:
            return rest.pod_names(self.namespace, MANAGED)
        finally:
            rest.close()

    def runs(self) -> list[tuple[int, int, str, str]]:
        """(id, status, cluster, pod name) of every run."""
        with psycopg.connect(self.settings.database_url, autocommit=True) as db:
            rows = db.execute("SELECT id, status, cluster, pod_name FROM runs ORDER BY id").fetchall()
        return [(int(str(r[0])), int(str(r[1])), str(r[2] or ""), str(r[3] or "")) for r in rows]
