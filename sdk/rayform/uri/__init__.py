"""Dataset and mixture URIs: a training set named by one string (docs/tracking.md).

``rayform://HOST/slc_.../MANIFEST_HASH?...`` names an :class:`~rayform.torch.EpisodeDataset`
(:class:`DatasetURI`, module ``_dataset``), ``rayform:///mix?...`` a
:class:`~rayform.torch.MixtureDataset` (:class:`MixtureURI`, module ``_mixture``); a selection
travels as a short expression (module ``_selexpr``). Parsing never imports torch.
"""

from rayform.uri._dataset import QUERY_VERSION, SCHEMES, DatasetURI, clean_endpoint
from rayform.uri._mixture import MIX_VERSION, MixtureURI, is_mixture_uri
from rayform.uri._selexpr import parse_selection, select_arguments, selection_expression

__all__ = [
    "MIX_VERSION",
    "QUERY_VERSION",
    "SCHEMES",
    "DatasetURI",
    "clean_endpoint",
    "MixtureURI",
    "is_mixture_uri",
    "parse_selection",
    "select_arguments",
    "selection_expression",
]
