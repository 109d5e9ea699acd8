from __future__ import annotations

from django import forms

from webapp.recordings.models import Recording
from webapp.recordings.selectors import RecordingFilters


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

    def __init__(self, *args, engines: list[str], everyone: bool, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["engine"].choices = [("", "any engine"), *((e, e) for e in engines)]
        if not everyone:
            del self.fields["mine"]  # everyone else only ever sees their own

    def filters(self) -> RecordingFilters:
        if not self.is_valid():
            return RecordingFilters()
        data = {k: v for k, v in self.cleaned_data.items() if v not in (None, "")}
        return RecordingFilters(**data)
