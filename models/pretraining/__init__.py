"""Privacy-adaptive pretraining: masked language modelling on privatized public text
(``pretrain``, ``mlm``, ``pretrain_data``).
"""
