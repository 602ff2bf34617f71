"""`sapling-node experiment`: several simulated nodes on one computer, compared per round and per hour.

- `plan`: what an experiment runs and where it keeps it (torch-free; the report reads it too);
- `runner`: runs a plan (`Experiment`), one folder per mix;
- `batched_round`: one round of every node of a mix, generated in one batch, each node timed as if alone;
- `nodes`: a simulated node's view of the shared model and its exchange;
- `evaluation`: each node's held-out evaluations on the way, and its best checkpoint by held-out kept;
- `hours`: what a node's round costs its computer, and mixes compared at equal time;
- `heldout`: held-out accuracy of two mixes at equal time, question by question;
- `batch_mean`: the training batch's mean reward as the paper's trainer logs it, under each definition;
- `report`: one folder's report.json, report.md and plots;
- `compare`: mixes of several folders side by side: paired, pooled over seeds, plotted together;
- `upto`: a long run's records as they stood after round N;
- `records`: run folders packed into one archive, read as they are;
- `terminal`: the experiment's progress in a terminal.
"""
