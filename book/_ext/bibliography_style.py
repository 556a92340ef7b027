"""Author–year labels in the bibliography, to match the author–year citations in the text.

The text cites with sphinxcontrib-bibtex's ``author_year`` reference style ("Vaswani et al.,
2017"), but the bibliography's labels come from a pybtex formatting style, and pybtex's own
label styles are numbers ("[1]") or alpha codes ("[VSP+17]"). This extension registers a
label style, ``author_year``, that labels each entry with the same text as its parenthetical
citation, and a formatting style, ``plain_author_year`` (pybtex's ``plain`` with those
labels), which ``_config.yml`` selects with ``bibtex_default_style``.

Two works with the same first author and year would get the same label; the bibliography
has none (``tests/html/check_html.py`` checks that the labels are author–year).
"""

from __future__ import annotations

import pybtex.plugin
import sphinxcontrib.bibtex.plugin
from pybtex.style.formatting.plain import Style as PlainStyle
from pybtex.style.labels import BaseLabelStyle
from sphinxcontrib.bibtex.style.template import join, year


class AuthorYearLabelStyle(BaseLabelStyle):
    """Labels such as "Vaswani et al., 2017", "Kingma and Ba, 2015", "Rush, 2018"."""

    def format_labels(self, sorted_entries):
        # The names exactly as the author_year citation style writes them in the text.
        citation = sphinxcontrib.bibtex.plugin.find_plugin(
            "sphinxcontrib.bibtex.style.referencing", "author_year"
        )()
        label = join(sep=", ")[citation.person.author_or_editor_or_title(full=False), year]
        for entry in sorted_entries:
            yield label.format_data({"entry": entry, "style": citation}).render_as("text")


class PlainAuthorYearStyle(PlainStyle):
    """pybtex's ``plain`` formatting and sorting, with author–year labels."""

    default_label_style = "author_year"


def setup(app):
    pybtex.plugin.register_plugin("pybtex.style.labels", "author_year", AuthorYearLabelStyle)
    pybtex.plugin.register_plugin(
        "pybtex.style.formatting", "plain_author_year", PlainAuthorYearStyle
    )
    return {"parallel_read_safe": True, "parallel_write_safe": True}
