"""The process's ``Deployment`` behind the facade: admission and draining flags, their refusals and counts,
held by the object (two deployments do not share them) and forgotten by ``stop`` (the counts stay)."""

from __future__ import annotations

import pytest

from inference import api
from inference.contracts import ParleyError, Ready, SessionRequest
from inference.deployment import IN_PROCESS_ID, Deployment
from tests.inference.event_helpers import EventReader


async def test_stopped_admission_refuses_new_users_counts_them_and_lets_a_returning_user_in(facade):
    await facade(slots=2)
    deployment = Deployment()
    alice = await deployment.open_session(SessionRequest(user_key="alice"))
    assert isinstance(await EventReader(alice).next(), Ready)

    await deployment.set_admission(False)
    assert await deployment.admission_open() is False
    with pytest.raises(ParleyError) as refused:
        await deployment.open_session(SessionRequest(user_key="bob"))
    assert refused.value.code == "resource_exhausted" and refused.value.param == "admission"
    again = await deployment.open_session(SessionRequest(user_key="alice"))  # takes over her live session
    assert isinstance(await EventReader(again).next(), Ready)
    assert deployment.admissions_refused == {"admission_stopped": 1}
    assert await api.admission_open() is True, "the facade's own deployment was not touched"

    await deployment.stop()
    assert await deployment.admission_open() is True
    assert deployment.admissions_refused == {"admission_stopped": 1}, "counts outlive a restart"
    await again.close()


async def test_draining_the_in_process_service_refuses_new_users_and_shows_in_its_status(facade):
    await facade(slots=2)
    deployment = Deployment()
    assert await deployment.set_draining("another-service", True) is False
    assert await deployment.set_draining(IN_PROCESS_ID, True) is True
    (status,) = await deployment.services()
    assert status.service_id == IN_PROCESS_ID and status.state == "draining"
    with pytest.raises(ParleyError) as refused:
        await deployment.open_session(SessionRequest(user_key="carol"))
    assert refused.value.code == "resource_exhausted" and "draining" in str(refused.value)
    assert deployment.admissions_refused == {"capacity": 1}

    await deployment.set_draining(IN_PROCESS_ID, False)
    (status,) = await deployment.services()
    assert status.state == "serving"
    handle = await deployment.open_session(SessionRequest(user_key="carol"))
    assert isinstance(await EventReader(handle).next(), Ready)
    await handle.close()
