"""At the end of a run, draw per-domain training curves and say where everything is."""

import json
import math
from pathlib import Path

from mmengine.dist import is_main_process
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class TrainingCurvesHook(Hook):
    """Writes ``<work_dir>/training_curves.png`` (and ``.json``) after training.

    The figure has per-domain group entropy (the paper's Figures 4-5), validation
    accuracy per domain or benchmark (Figure 3) and policy entropy over steps, drawn from the
    loop's metric history (checkpointed, so a resumed run draws the whole run).
    Then it prints the paths of the figure, the log and the scalar file.
    """

    priority = 'VERY_LOW'

    def after_run(self, runner) -> None:
        if not is_main_process():
            return
        history = getattr(runner.train_loop, 'history', None)
        if not history:
            return
        from ...analysis.curves import plot_training_curves  # matplotlib only when drawing

        work_dir = Path(runner.work_dir)
        figure = plot_training_curves(history, work_dir / 'training_curves.png',
                                      title=Path(runner.cfg.filename or 'run').stem)
        clean = [{k: (None if isinstance(v, float) and math.isnan(v) else v)
                  for k, v in row.items()} for row in history]
        (work_dir / 'training_curves.json').write_text(json.dumps(clean) + '\n')
        log_dir = Path(runner.log_dir)
        lines = [f'figure:  {figure}', f'history: {work_dir / "training_curves.json"}',
                 f'log:     {log_dir / (runner.timestamp + ".log")}',
                 f'scalars: {log_dir / "vis_data" / "scalars.json"}']
        final = [row for row in history if 'val/acc' in row]
        if len(final) >= 2:
            lines.append(f'val/acc: {final[0]["val/acc"]:.3f} at step {int(final[0]["step"])} -> '
                         f'{final[-1]["val/acc"]:.3f} at step {int(final[-1]["step"])}')
        runner.logger.info('Training curves and logs:\n  ' + '\n  '.join(lines))
