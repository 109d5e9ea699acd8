"""Forms for sign-up by invite and API key creation."""

from django import forms
from django.contrib.auth.forms import UserCreationForm


class InviteSignupForm(UserCreationForm):
    invite_code = forms.CharField(max_length=40, help_text="The code a staff member gave you.")

    class Meta(UserCreationForm.Meta):
        fields = ("invite_code", "username")


class ApiKeyCreateForm(forms.Form):
    name = forms.CharField(max_length=100, required=False, help_text="What the key is for (optional).")


class InviteCreateForm(forms.Form):
    note = forms.CharField(max_length=200, required=False, help_text="Who the invite is for (optional).")
