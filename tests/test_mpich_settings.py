"""Where the launcher oversubscribes a node, MPICH's spinning shared-memory collectives are switched off."""
from sagips.comm import OVERSUBSCRIBED_CVARS, oversubscription_settings


def test_oversubscribed_node_gets_the_generic_collectives():
    assert oversubscription_settings({"MPI_LOCALNRANKS": "4"}, cores=2) == OVERSUBSCRIBED_CVARS
    assert oversubscription_settings({"PALS_LOCAL_SIZE": "8"}, cores=4) == OVERSUBSCRIBED_CVARS
    assert oversubscription_settings({"OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, cores=1) == OVERSUBSCRIBED_CVARS
    assert set(OVERSUBSCRIBED_CVARS) == {"MPIR_CVAR_BCAST_POSIX_INTRA_ALGORITHM",
                                         "MPIR_CVAR_REDUCE_POSIX_INTRA_ALGORITHM",
                                         "MPIR_CVAR_ALLREDUCE_POSIX_INTRA_ALGORITHM"}


def test_a_node_with_enough_cores_or_no_launcher_is_left_alone():
    assert oversubscription_settings({"MPI_LOCALNRANKS": "4"}, cores=4) == {}  # Polaris: 4 ranks, 32 cores
    assert oversubscription_settings({"MPI_LOCALNRANKS": "1"}, cores=1) == {}
    assert oversubscription_settings({}, cores=1) == {}  # not under a launcher
    assert oversubscription_settings({"MPI_LOCALNRANKS": "many"}, cores=1) == {}


def test_the_users_own_setting_wins():
    env = {"MPI_LOCALNRANKS": "4", "MPIR_CVAR_BCAST_POSIX_INTRA_ALGORITHM": "release_gather"}
    got = oversubscription_settings(env, cores=2)
    assert "MPIR_CVAR_BCAST_POSIX_INTRA_ALGORITHM" not in got and len(got) == 2
