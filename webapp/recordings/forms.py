from __future__ import annotations

from django import forms

from webapp.common.errors import ApplicationError
from webapp.recordings.models import Recording
from webapp.recordings.review_filters import ReviewFilters
from webapp.recordings.review_models import Label
from webapp.recordings.selectors import RecordingFilters

REVIEW_FIELDS = ("label", "tag", "min_rating", "max_rating", "rated")
RATED_CHOICES = [("", "rated or not"), ("yes", "rated"), ("no", "not rated yet")]


class RecordingFilterForm(forms.Form):
    """The list page's search and filters; invalid values are reported, never a server error."""

    q = forms.CharField(required=False, max_length=200, label="Search")
    persona = forms.CharField(required=False, max_length=200)
    voice = forms.CharField(required=False, max_length=200)
    engine = forms.ChoiceField(required=False, choices=[("", "any engine")])
    status = forms.ChoiceField(required=False, choices=[("", "any status"), *Recording.Status.choices])
    date_from = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}), label="From")
    date_to = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}), label="To")
    min_duration_s = forms.FloatField(required=False, min_value=0, label="Min s")
    max_duration_s = forms.FloatField(required=False, min_value=0, label="Max s")
    mine = forms.BooleanField(required=False, label="Only mine")
    label = forms.ChoiceField(required=False, choices=[("", "any label")], label="Label")
    tag = forms.CharField(required=False, max_length=40, label="Tag")
    min_rating = forms.IntegerField(required=False, min_value=1, max_value=5, label="Rating from")
    max_rating = forms.IntegerField(required=False, min_value=1, max_value=5, label="Rating to")
    rated = forms.ChoiceField(required=False, choices=RATED_CHOICES, label="Rated")

    def __init__(self, *args, engines: list[str], everyone: bool, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["engine"].choices = [("", "any engine"), *((e, e) for e in engines)]
        self.fields["label"].choices = [
            ("", "any label"),
            *((n, n) for n in Label.objects.values_list("name", flat=True)),
        ]
        if not everyone:
            del self.fields["mine"]  # everyone else only ever sees their own

    def filters(self) -> RecordingFilters:
        if not self.is_valid():
            return RecordingFilters()
        data = {k: v for k, v in self.cleaned_data.items() if v not in (None, "")}
        review = ReviewFilters(**{k: data.pop(k) for k in REVIEW_FIELDS if k in data})
        return RecordingFilters(**data, review=review)


def selection_filters(*, user, query: dict[str, str], engines: list[str], everyone: bool) -> RecordingFilters:
    """The filters of a saved list query (an export's selection); invalid ones are refused, never widened to all."""
    form = RecordingFilterForm({k: v for k, v in query.items() if k != "page"}, engines=engines, everyone=everyone)
    if not form.is_valid():
        problems = "; ".join(f"{name}: {' '.join(errors)}" for name, errors in form.errors.items())
        raise ApplicationError(f"These filters are not valid: {problems}")
    return form.filters()
