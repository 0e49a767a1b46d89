"""Forms of the portal's own pages."""

from __future__ import annotations

from django import forms
from django.conf import settings


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, required=False, help_text="What the token is for.")
    days = forms.IntegerField(
        min_value=1,
        max_value=settings.BATON_TOKEN_MAX_DAYS,
        initial=settings.BATON_TOKEN_DAYS,
        help_text="The token stops working after this many days.",
    )
