"""The review panel's forms and who may use them: annotate, rate, tag, share; the list's review filters."""

from __future__ import annotations

import html
import re

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from webapp.recordings import sharing
from webapp.recordings.models import Annotation, Label, Rating, Recording, RecordingShare, RecordingTag

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def setup(make_recording, django_user_model, review_seed):
    owner = django_user_model.objects.create_user(username="owner", password="x")
    reviewer = django_user_model.objects.create_user(username="rita", password="x")
    reviewer.groups.add(sharing.reviewers_group())
    recording = make_recording(owner, session_id="sess_review1", duration_s=12.0, status=Recording.Status.READY)
    return owner, reviewer, recording


def add_span(client, recording, label="echo", start="1.0", end="2.5", note=""):
    data = {"label": Label.objects.get(name=label).pk, "start_s": start, "end_s": end, "note": note}
    return client.post(reverse("annotation-add", args=[recording.pk]), data, follow=True)


def text(response) -> str:
    """The page as a reader sees it (messages hold apostrophes, which the template escapes)."""
    return html.unescape(response.content.decode())


def listed(client, **query) -> list[str]:
    """Session ids of the list page's rows, oldest first."""
    body = text(client.get(reverse("recording-list"), query))
    pks = [int(pk) for pk in re.findall(r'data-recording="(\d+)"', body)]
    return list(Recording.objects.filter(pk__in=pks).order_by("pk").values_list("session_id", flat=True))


def test_the_seeded_label_set_and_reviewers_group_exist(review_seed):
    """Migration 0005's seed (which review_seed runs again: a transactional test's flush empties the tables)."""
    names = list(Label.objects.values_list("name", flat=True))
    assert names == ["talked over the caller", "missed a turn", "too slow", "wrong answer", "echo", "good"]
    assert sharing.reviewers_group().name == "reviewers"


def test_a_reviewer_sees_a_recording_only_once_it_is_shared(client, setup, django_user_model):
    owner, reviewer, recording = setup
    detail = reverse("recording-detail", args=[recording.pk])
    client.force_login(reviewer)
    assert client.get(detail).status_code == 404 and listed(client) == []
    assert add_span(client, recording).status_code == 404  # nor annotate it
    client.force_login(owner)
    page = client.post(reverse("recording-share", args=[recording.pk]), {"reviewer": ""}, follow=True)
    assert "Shared with all reviewers." in text(page)
    client.force_login(reviewer)
    assert client.get(detail).status_code == 200 and listed(client) == ["sess_review1"]
    reviewer.groups.clear()  # out of the group: out of sight
    assert client.get(detail).status_code == 404
    # A named share reaches that reviewer only; a user outside the group cannot be named.
    reviewer.groups.add(sharing.reviewers_group())
    RecordingShare.objects.all().delete()
    other = django_user_model.objects.create_user(username="otto", password="x")
    other.groups.add(sharing.reviewers_group())
    outsider = django_user_model.objects.create_user(username="olga", password="x")
    client.force_login(owner)
    page = client.post(reverse("recording-share", args=[recording.pk]), {"reviewer": "olga"}, follow=True)
    assert "olga is not a reviewer." in text(page)
    client.post(reverse("recording-share", args=[recording.pk]), {"reviewer": "rita"})
    for user, code in ((reviewer, 200), (other, 404), (outsider, 404)):
        client.force_login(user)
        assert client.get(detail).status_code == code, user.username
    # A reviewer may not share it on, nor stop the owner's share.
    client.force_login(reviewer)
    page = client.post(reverse("recording-share", args=[recording.pk]), {"reviewer": "otto"}, follow=True)
    assert "Only the recording's owner" in text(page)
    share = RecordingShare.objects.get()
    client.post(reverse("recording-unshare", args=[recording.pk, share.pk]))
    assert RecordingShare.objects.exists()
    client.force_login(owner)
    client.post(reverse("recording-unshare", args=[recording.pk, share.pk]))
    client.force_login(reviewer)
    assert client.get(detail).status_code == 404


def test_staff_share_other_users_recordings_only_with_the_permission(client, setup, django_user_model):
    _, _, recording = setup
    staff = django_user_model.objects.create_user(username="sam", password="x", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_recording"))
    client.force_login(staff)
    page = client.post(reverse("recording-share", args=[recording.pk]), {"reviewer": ""}, follow=True)
    assert "Only the recording's owner" in text(page) and not RecordingShare.objects.exists()
    staff.user_permissions.add(Permission.objects.get(codename="add_recordingshare"))
    client.post(reverse("recording-share", args=[recording.pk]), {"reviewer": ""})
    assert RecordingShare.objects.get().shared_by == staff


def test_annotations_are_checked_and_bad_input_is_a_message(client, setup):
    owner, _, recording = setup
    client.force_login(owner)
    assert "Labelled 1.0-2.5 s as “echo”." in text(add_span(client, recording, note="  hears itself "))
    assert Annotation.objects.get().note == "hears itself"
    refusals = {
        ("echo", "3", "2", ""): "start before its end",
        ("echo", "-1", "2", ""): "start before its end",
        ("echo", "1", "40", ""): "ends after the call (12.0 s)",
        ("echo", "nan", "2", ""): "must be a number",
        ("echo", "1e999", "2", ""): "must be a number",
        ("echo", "one", "2", ""): "is not a number",
        ("echo", "1", "2", "x" * 1001): "at most 1000 characters",
    }
    for (label, start, end, note), message in refusals.items():
        page = add_span(client, recording, label, start, end, note)
        assert page.status_code == 200 and message in text(page), message
    for label, message in (("999999", "Pick a label"), ("99999999999", "Choose a label"), ("x", "Choose a label")):
        page = client.post(reverse("annotation-add", args=[recording.pk]), {"label": label, "start_s": "1",
                                                                             "end_s": "2"}, follow=True)  # fmt: skip
        assert message in text(page), label
    assert Annotation.objects.count() == 1
    assert client.get(reverse("annotation-add", args=[recording.pk])).status_code == 405


def test_only_the_author_or_the_owner_removes_an_annotation_or_a_tag(client, setup):
    owner, reviewer, recording = setup
    sharing.share_create(recording=recording, by=owner, reviewer=None)
    client.force_login(owner)
    add_span(client, recording, "good")
    client.post(reverse("recording-tag", args=[recording.pk]), {"tag": "keeper"})
    client.force_login(reviewer)
    add_span(client, recording, "too slow", "3", "4")
    owners, reviewers = Annotation.objects.get(label__name="good"), Annotation.objects.get(label__name="too slow")
    page = client.post(reverse("annotation-delete", args=[recording.pk, owners.pk]), follow=True)
    assert "Only its author or the recording's owner" in text(page)
    client.post(reverse("recording-untag", args=[recording.pk, RecordingTag.objects.get().pk]))
    assert Annotation.objects.count() == 2 and RecordingTag.objects.count() == 1
    client.force_login(owner)
    client.post(reverse("annotation-delete", args=[recording.pk, reviewers.pk]))
    assert list(Annotation.objects.values_list("label__name", flat=True)) == ["good"]


def test_ratings_one_per_reviewer_and_tags_normalised(client, setup):
    owner, reviewer, recording = setup
    client.force_login(owner)
    rate = reverse("recording-rate", args=[recording.pk])
    client.post(rate, {"rating": "4"})
    client.post(rate, {"rating": "2"})  # replaces the first
    for bad, message in (("0", "A rating is 1 to 5"), ("6", "A rating is 1 to 5"), ("x", "Choose a rating"),
                         ("", "Choose a rating"), ("4.5", "Choose a rating")):  # fmt: skip
        assert message in text(client.post(rate, {"rating": bad}, follow=True)), bad
    assert list(Rating.objects.values_list("stars", flat=True)) == [2]
    tag = reverse("recording-tag", args=[recording.pk])
    client.post(tag, {"tag": "  Needs   Work "})
    client.post(tag, {"tag": "needs work"})
    for bad in ("", "   ", "<script>", "x" * 41):
        assert "A tag is 1 to 40" in text(client.post(tag, {"tag": bad}, follow=True)), bad
    assert list(RecordingTag.objects.values_list("tag__name", flat=True)) == ["needs work"]
    page = text(client.get(reverse("recording-detail", args=[recording.pk])))
    assert "Mean 2.0 of 5 from 1 rating; yours: 2." in page and 'data-tag="needs work"' in page


def test_labels_tags_and_ratings_filter_and_search_the_list(client, setup, make_recording):
    owner, _, first = setup
    second = make_recording(owner, session_id="sess_review2", duration_s=8.0, status=Recording.Status.READY)
    client.force_login(owner)
    add_span(client, first, "echo", note="the agent hears itself")
    add_span(client, first, "echo", "3", "4")  # two spans: still one row
    add_span(client, second, "good")
    client.post(reverse("recording-tag", args=[second.pk]), {"tag": "demo"})
    client.post(reverse("recording-rate", args=[first.pk]), {"rating": "2"})
    client.post(reverse("recording-rate", args=[second.pk]), {"rating": "5"})
    assert listed(client, label="echo") == ["sess_review1"]
    assert text(client.get(reverse("recording-list"), {"label": "echo"})).count("data-recording=") == 1
    assert listed(client, label="good") == ["sess_review2"]
    assert listed(client, tag="Demo") == ["sess_review2"]
    assert listed(client, min_rating="4") == ["sess_review2"]
    assert listed(client, max_rating="3") == ["sess_review1"]
    assert listed(client, q="hears itself") == ["sess_review1"]  # a note
    assert listed(client, q="demo") == ["sess_review2"]  # a tag
    assert listed(client, q="echo") == ["sess_review1"]  # a label's name
    assert listed(client, rated="no") == []
    assert "Ensure this value is less than or equal to 5" in text(
        client.get(reverse("recording-list"), {"min_rating": "9"})
    )


def test_the_label_set_is_configured_in_the_admin_and_retired_labels_leave_the_picker(client, setup, django_user_model):
    owner, _, recording = setup
    admin = django_user_model.objects.create_superuser(username="root", password="x")
    client.force_login(admin)
    assert client.get(reverse("admin:recordings_label_changelist")).status_code == 200
    echo = Label.objects.get(name="echo")
    page = client.post(reverse("admin:recordings_label_add"), {"name": "barged in late", "position": 9, "active": "on"})
    assert page.status_code == 302 and Label.objects.filter(name="barged in late").exists()
    Label.objects.filter(pk=echo.pk).update(active=False)
    client.force_login(owner)
    page = text(client.get(reverse("recording-detail", args=[recording.pk])))
    assert ">barged in late</option>" in page and ">echo</option>" not in page
    assert "Pick a label" in text(add_span(client, recording, "echo"))
