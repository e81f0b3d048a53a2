"""A run interrupted in this process (Ctrl-C) says so in its last line."""
import os


def test_an_interrupted_run_says_so_in_its_last_line(tmp_path):
    from elastictrainer import config
    from elastictrainer.runs import loop

    lines = []

    def log(msg):
        lines.append(msg)
        if msg.startswith("epoch 1:"):
            os.kill(os.getpid(), 2)  # SIGINT, as Ctrl-C

    cfg = config.Config(model_name="smallcnn", dataset_name="synthetic", input_size=16,
                        batch_size=8, weights="none", num_epochs=3, steps_per_epoch=3,
                        train_type="full_training", logdir=str(tmp_path), run_name="r",
                        progress=False)
    assert loop.run(cfg, log=log)["status"] == "interrupted"
    assert "interrupted after 1 of 3 epochs" in lines[-1]
