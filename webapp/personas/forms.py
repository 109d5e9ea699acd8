"""Forms of the persona and voice pages; choices are limited to what the user may see."""

from __future__ import annotations

from django import forms

from webapp.accounts.permissions import may
from webapp.personas.models import Persona
from webapp.personas.selectors import CHANGE_ANY_PERSONA, SHARE_VOICE, voice_list_for


class PersonaForm(forms.ModelForm):
    shared = forms.BooleanField(required=False, help_text="Visible to every user (staff with the permission).")

    class Meta:
        model = Persona
        fields = ["name", "instructions", "default_voice"]
        widgets = {"instructions": forms.Textarea(attrs={"rows": 6})}

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = user
        self.fields["default_voice"].queryset = voice_list_for(user=user, usable_only=True)
        self.fields["default_voice"].required = False
        self.fields["instructions"].max_length = 20_000
        if may(user, CHANGE_ANY_PERSONA):
            self.fields["shared"].initial = self.instance.pk is not None and self.instance.owner_id is None
        else:
            del self.fields["shared"]

    def clean_instructions(self) -> str:
        text = self.cleaned_data["instructions"].strip()
        if not text:
            raise forms.ValidationError("The instructions may not be empty.")
        if len(text) > 20_000:
            raise forms.ValidationError("At most 20,000 characters.")
        return text


class VoiceUploadForm(forms.Form):
    """A cloned voice: the clip (uploaded or recorded) and the consent recording of the displayed sentence."""

    name = forms.CharField(max_length=100)
    clip = forms.FileField(help_text="wav, flac, ogg/opus, webm, mp3 or m4a; 3 to 30 s of speech; at most 10 MB")
    consent = forms.FileField(help_text="You reading the sentence above aloud.")
    shared = forms.BooleanField(required=False, help_text="Visible to every user (staff with the permission).")

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        if not may(user, SHARE_VOICE):
            del self.fields["shared"]
